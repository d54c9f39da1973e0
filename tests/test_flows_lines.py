"""Several lines in one project, on the toy project with a real Prefect server, real dvc and a
bare git repository standing in for the team's remote: one `flows.serve` serves a retrain per
line, both run at once (a run's own overrides after its line's) and are promoted as v1 of their
own line, a pipeline run records the line whose recipe it ran and `flows.promote EXPERIMENT`
gates it there, a worse candidate of one line is refused against its own champion only, a
clone of the remote fetches each champion, and a project promoted before lines keeps its
registry under the new code."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers.lines import LINES, declare, python, tags
from prefect_fixtures import (
    DVC,
    ROOT,
    client,
    deployment_run,
    flows_run,
    make_toy,
    run_id,
    served,
    sh,
    wait_until,
)

from flows import registry
from flows.promote import resolve_experiment


def with_remotes(toy: Path, tmp_path: Path) -> Path:
    """A bare git repository as origin and a DVC remote `store` (default, committed)."""
    bare = tmp_path / "team.git"
    sh("git", "init", "-q", "--bare", str(bare), cwd=tmp_path)
    sh("git", "remote", "add", "origin", str(bare), cwd=toy)
    sh(*DVC, "remote", "add", "-d", "store", str(tmp_path / "store"), cwd=toy)
    sh("git", "commit", "-qm", "DVC remote", ".dvc/config", cwd=toy)
    sh("git", "push", "-q", "origin", "main", cwd=toy)
    return bare


def finished(run: str):
    def ended():
        with client() as c:
            r = c.read_flow_run(run)
        return r if r.state.is_final() else None

    return wait_until(f"flow run {run} to end", ended, timeout=1200)


@pytest.mark.slow
def test_two_lines_served_at_once_gated_apart_and_fetched_from_the_team_remote(
    prefect_server: dict, tmp_path: Path
) -> None:
    toy = make_toy(tmp_path / "toy")
    declare(toy, LINES)
    bare = with_remotes(toy, tmp_path)
    corpus = str(toy.parent / "corpus")
    env = {**prefect_server, "TOY_CORPUS": corpus, "PYTHONPATH": str(toy)}
    with served(toy, env, TOY_CORPUS=corpus) as proc:
        log = proc.log_path.read_text()
        shown = 'retrain/en-de: {"line": "en-de", "recipe": {"preset": "demo", "overrides": []}, '
        assert shown in log, log
        assert '"retrain.margin=0.5"]}, "schedule": "0 4 * * 1"}' in log, log
        # this machine's train stages take turns (flows/cores.py): its limit, made at start
        assert "train stages: 1 at a time on this machine (Prefect concurrency limit " in log
        with client() as c:  # the line alone: each run reads its recipe from its commit
            assert c.read_deployment_by_name("retrain/de-en").parameters == {"line": "de-en"}
        # started at the same moment: neither waits for the other (one slot per line); a run's
        # `-p overrides` come after its line's, the line's gate kept
        more = ("--params", json.dumps({"overrides": ["train.seed=7"]}))
        runs = [
            run_id(deployment_run(env, f"retrain/{n}", *args, watch=False, cwd=toy).stdout)
            for n, args in (("en-de", ()), ("de-en", more))
        ]
        ends = [finished(r) for r in runs]
        assert all(r.state.is_completed() for r in ends), [r.state for r in ends]
        # the README's pipeline run: it records the line whose recipe it ran, en-de's
        r = flows_run(env, "pipeline/demo", "-p", 'overrides=["train.max_steps=700"]', cwd=toy)
        assert r.returncode == 0, r.stdout + r.stderr
    (pipeline_exp,) = re.findall(r"through the gate: python -m flows\.promote (\S+)\)", r.stdout)
    (first,) = registry.decision_tags(toy, "de-en")
    assert first["candidate"]["overrides"] == [  # the line's, its gate's, the run's, the pins
        "train.max_steps=500",
        "download.src_lang=de",
        "download.tgt_lang=en",
        "retrain.margin=0.5",
        "train.seed=7",
        "helpers.backward=en-de",
    ]
    assert first["gate"]["rules"]["margin"] == 0.5
    mine = tags(toy, "en-de*", "de-en*", "decision")
    assert {t for t in mine if "#" in t or "@" in t} == {
        "en-de@v1.0.0",
        "en-de#prod#1",
        "de-en@v1.0.0",
        "de-en#prod#1",
    }
    assert {"decision/en-de/0001", "decision/de-en/0001"} <= set(mine)
    assert mine["en-de@v1.0.0"] != mine["de-en@v1.0.0"]  # each line its own experiment
    for n in ("en-de", "de-en"):  # each line its own workspace
        assert (toy / ".dvc/tmp/flows/lines" / n / "dvc.lock").exists()
    assert tags(bare, "*") == tags(toy, "*")  # the registry reached the team's remote

    # a clone of the team's remote (not of the serving repository) fetches each champion
    clone = tmp_path / "clone"
    sh("git", "clone", "-q", str(bare), str(clone), cwd=tmp_path)
    for n, steps in (("en-de", 600), ("de-en", 500)):
        sh(
            *DVC,
            "artifacts",
            "get",
            ".",
            n,
            "--stage",
            "prod",
            "-o",
            n,
            "--remote",
            "store",
            cwd=clone,
        )
        assert (clone / n / "model.pt").read_text().startswith(f"{steps} ")

    # `python -m flows.promote EXPERIMENT`, as the README says: the pipeline run recorded en-de
    # (its recipe is en-de's, with its own override after it)
    assert registry.record_at(toy, resolve_experiment(toy, pipeline_exp))["line"] == "en-de"
    r = python(["-m", "flows.promote", pipeline_exp], toy, env)
    assert r.returncode == 0 and "promoted as v2.0.0" in r.stdout, r.stdout + r.stderr
    assert "en-de@v2.0.0" in tags(toy, "en-de@*")

    # a worse candidate of de-en meets de-en's champion only; en-de's tags stay as they were
    before = tags(toy, "en-de*", "decision/en-de/*")
    sh(
        *DVC,
        "exp",
        "run",
        "-q",
        "-n",
        "worse",
        "-S",
        "train.max_steps=100",
        cwd=toy,
        env={**env, "TOY_CORPUS": corpus},
    )
    r = python(["-m", "flows.promote", "worse"], toy, env)
    assert r.returncode == 1 and "belongs to no line: it was run by hand" in r.stderr, r.stderr
    assert "en-de (preset demo); de-en (preset demo, overrides train.max_steps=500" in r.stderr
    assert "name one with --line NAME" in r.stderr
    r = python(["-m", "flows.promote", "worse", "--line", "de-en"], toy, env)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "does not beat champion 50.00 by more than the margin 0.5" in r.stdout, r.stdout
    assert tags(toy, "en-de*", "decision/en-de/*") == before
    assert "decision/de-en/0002" in tags(bare, "decision/de-en/*")  # pushed as it was made
    assert set(tags(toy, "de-en#*")) == {"de-en#prod#1"}

    # make results: a table per line, each marking its own champion
    r = python(["-m", "flows.results"], toy, env)
    assert r.returncode == 0, r.stderr
    assert "line en-de: champion en-de@v2.0.0" in r.stdout
    assert "line de-en: champion de-en@v1.0.0" in r.stdout
    one = python(["-m", "flows.results", "--line", "de-en"], toy, env).stdout
    assert "line en-de" not in one and "refused" in one and one.count("*") == 1, one

    # issue 81: each line's first run had no champion of the other to use, and its lineage says
    # so; en-de's next retrain pins de-en's champion, a changed recipe: it trains, using it
    first_run = sh("git", "rev-list", "-n1", "en-de@v1.0.0", cwd=toy).strip()
    record = ["-c", f"from flows import registry; print(registry.record_at('.', '{first_run}'))"]
    assert (
        "'helpers': 'backward de-en: none (de-en had no champion yet"
        in python(record, toy, env).stdout
    )
    retrain = ["-c", "from flows.retrain import retrain; print(retrain(line='en-de')['reason'])"]
    r = python(retrain, toy, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "params_sha256 changed; trained from scratch" in r.stdout, r.stdout
    # (the champion is v2.0.0 now: the pipeline run promoted above, which pinned nothing)
    assert "using backward de-en@v1.0.0; used champions changed since v2.0.0: backward" in (
        r.stdout
    )
    fetched = toy / ".dvc/tmp/flows/lines/en-de/data/helpers/backward/model.pt"
    assert fetched.read_text() == (clone / "de-en" / "model.pt").read_text()  # its champion's
    wide = python(["-m", "flows.results", "--line", "en-de", "--wide"], toy, env).stdout
    assert "backward de-en@v1.0.0" in wide and "backward de-en: none" in wide, wide


OLD = "93a8df7"  # the last commit before lines: its flows/ as a project promoted then has it


@pytest.mark.slow
def test_a_project_promoted_before_lines_keeps_its_registry(
    prefect_server: dict, tmp_path: Path
) -> None:
    """Promoted with the code before lines (its flows/ from git), then moved to the new code
    with its own single-artifact declaration kept: its tags, `dvc artifacts get` and decisions
    still work, and its next retrain is gated against the champion it had."""
    toy = make_toy(tmp_path / "toy")
    sh("rm", "-rf", "flows", cwd=toy)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", OLD, "flows"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(toy)], input=archive.stdout, check=True)
    sh("git", "add", "-A", cwd=toy)
    sh("git", "commit", "-qm", "the flows before lines", cwd=toy)
    corpus = str(toy.parent / "corpus")
    env = {**prefect_server, "TOY_CORPUS": corpus, "PYTHONPATH": str(toy)}
    retrain = ["-c", "from flows.retrain import retrain; print(retrain()['reason'])"]
    r = python(retrain, toy, env)
    assert r.returncode == 0 and "no champion yet" in r.stdout, r.stdout + r.stderr
    assert set(tags(toy, "transformer*")) == {"transformer@v1.0.0", "transformer#prod#1"}

    sh("rm", "-rf", "flows", cwd=toy)  # the new code; dvc.yaml's `transformer` kept as it was
    sh("cp", "-r", str(ROOT / "flows"), str(toy / "flows"), cwd=toy)
    (toy / "presets/demo.yaml").write_text(
        (toy / "presets/demo.yaml").read_text().replace("max_steps: 600", "max_steps: 550")
    )
    sh("git", "add", "-A", cwd=toy)
    sh("git", "commit", "-qm", "the new code; a shorter recipe", cwd=toy)
    r = python(retrain, toy, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "does not beat champion 60.00" in r.stdout, r.stdout  # gated against v1.0.0
    found = python(["-c", "from flows import registry; print(registry.decisions('.'))"], toy, env)
    assert found.stdout.count("promoted as v1.0.0") == 1 and "refused" in found.stdout
    sh(*DVC, "artifacts", "get", ".", "transformer", "--stage", "prod", "-o", "got", cwd=toy)
    assert (toy / "got/model.pt").read_text().startswith("600 ")
