"""Several lines in one project, on the toy project with a real Prefect server, real dvc and a
bare git repository standing in for the team's remote. One scenario per module (`two_lines`):
the lines on a `process` work pool, as a GPU machine runs them (`prefect work-pool create NAME
--type process`, `python -m flows.deploy --pool NAME`, a `prefect worker start --pool NAME`
process), one retrain of each line started at once with `python -m flows.run retrain/NAME
--wait` (a run's own overrides after its line's), then the README's pipeline run through the
same worker. Its tests: the runs went through the worker and their train stages took turns on
the machine's cores (flows/cores.py); `flows.serve` shows each line's recipe and the machine's
turns; each line's run was promoted as v1 of its own line, the pipeline run is gated in the line
whose recipe it ran (`flows.promote EXPERIMENT`), a worse candidate of one line is refused
against its own champion only, and a clone of the remote fetches each champion. Apart: a
project promoted before lines keeps its registry under the new code."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.lines import LINES, declare, python, tags
from helpers.pool import POOL, Printed, alive, other, waiting, worker
from prefect_fixtures import (
    BIN,
    DVC,
    ROOT,
    client,
    flows_run,
    make_toy,
    served,
    sh,
    stop,
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


@dataclass(frozen=True)
class TwoLines:
    toy: Path
    bare: Path
    env: dict[str, str]  # the worker's, and what the tests run in the toy
    deployed: str  # what `flows.deploy --pool` printed
    deployments: dict[str, Any]  # each line's retrain/NAME as the server held it after deploy
    outs: dict[str, str]  # what each line's `flows.run --wait` printed
    codes: dict[str, int]  # ... and its exit status
    worker_log: str
    waiter: str  # the line whose train stage waited for the cores
    spans: dict[str, dict[str, float]]  # each line's train stage: its start and end
    tagged: dict[str, str]  # the lines' version and stage tags once both runs ended
    pipeline: subprocess.CompletedProcess  # the README's pipeline run, through the worker


@pytest.fixture(scope="module")
def two_lines(prefect_server: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoLines]:
    """The scenario, once: the tests read what it left (and the last one goes on from it)."""
    tmp_path = tmp_path_factory.mktemp("two-lines")
    toy = make_toy(tmp_path / "toy")
    declare(toy, LINES)
    bare = with_remotes(toy, tmp_path)
    hold = tmp_path / "hold"
    hold.touch()
    env = {
        **prefect_server,
        "TOY_CORPUS": str(toy.parent / "corpus"),
        "PYTHONPATH": str(toy),
        "PREFECT_WORKER_QUERY_SECONDS": "1",  # the worker asks for runs every second
        "TOY_SPANS": str(tmp_path / "spans"),  # each train stage's start and end
        "TOY_HOLD": str(hold),
    }
    sh(str(BIN / "prefect"), "work-pool", "create", POOL, "--type", "process", cwd=toy, env=env)
    r = python(["-m", "flows.deploy", "--pool", POOL, "--train-slots", "1"], toy, env)
    assert r.returncode == 0, r.stdout + r.stderr
    with client() as c:
        deployments = {n: c.read_deployment_by_name(f"retrain/{n}") for n in ("en-de", "de-en")}

    proc, runs, outs = worker(toy, env), {}, {}
    # both lines at once, as a cron job or a script starts them; de-en's run with its own
    # overrides, which come after the line's
    more = {"en-de": [], "de-en": ["-p", 'overrides=["train.seed=7"]']}
    try:
        for name in ("en-de", "de-en"):
            runs[name] = subprocess.Popen(
                [sys.executable, "-m", "flows.run", f"retrain/{name}", *more[name], "--wait"],
                cwd=toy,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            outs[name] = Printed(runs[name])
        # the first train stage holds the cores (TOY_HOLD) until the other waits for them
        waiter = wait_until("a train stage to wait for the cores", lambda: waiting(outs), every=0.5)
        wait_until(
            f"{waiter}'s flows.run to say it waits",
            lambda: "stage train: AwaitingConcurrencySlot: waiting for the cores" in outs[waiter],
        )
        hold.unlink()
        for p in runs.values():
            p.wait(timeout=1200)
        spans: dict[str, dict[str, float]] = {}
        for line in (tmp_path / "spans").read_text().splitlines():  # before the pipeline run's
            where, what, at = line.rsplit(" ", 2)
            spans.setdefault(Path(where).name, {})[what] = float(at)
        lines_tags = tags(toy, "en-de*", "de-en*")
        # the README's pipeline run: it records the line whose recipe it ran, en-de's
        pipeline = flows_run(
            env, "pipeline/demo", "-p", 'overrides=["train.max_steps=700"]', cwd=toy
        )
    finally:
        for p in runs.values():
            p.kill()
        stop(proc, signal.SIGTERM)  # the worker's whole process group
    wait_until(
        "the worker's process group to end", lambda: not alive(proc.pid, group=True), timeout=60
    )
    yield TwoLines(
        toy,
        bare,
        env,
        r.stdout + r.stderr,
        deployments,
        {name: str(out) for name, out in outs.items()},
        {name: p.returncode for name, p in runs.items()},
        proc.log_path.read_text(),
        waiter,
        spans,
        lines_tags,
        pipeline,
    )


@pytest.mark.slow
def test_the_lines_run_on_a_process_work_pool_through_a_worker(two_lines: TwoLines) -> None:
    """Each line's `retrain/NAME` is on the pool; the run of each, started at once, ends
    Completed through the worker; their train stages never overlap, and the one that waited
    says so."""
    lines = two_lines
    assert "Looks like you're deploying" not in lines.deployed  # a process pool is meant
    for name in ("en-de", "de-en"):
        assert f"deployment retrain/{name} on work pool {POOL}" in lines.deployed, lines.deployed
    for name, cron in (("en-de", None), ("de-en", "0 4 * * 1")):
        d = lines.deployments[name]
        assert d.work_pool_name == POOL and d.parameters == {"line": name}, d
        assert d.global_concurrency_limit.limit == 1  # one run at a time per line
        assert d.job_variables["working_dir"] == str(lines.toy.resolve())
        assert d.job_variables["env"]["FLOWS_TRAIN_SLOTS"] == "1"  # each machine's turns
        assert [s.schedule.cron for s in d.schedules] == ([cron] if cron else [])
    for name, out in lines.outs.items():
        assert lines.codes[name] == 0, f"{name}:\n{out}\nworker:\n{lines.worker_log}"
        run_id = out.split("UUID: ")[1].split()[0]
        with client() as c:
            run = c.read_flow_run(run_id)
        assert run.state.is_completed() and run.work_pool_name == POOL, run
        assert run_id in lines.worker_log, lines.worker_log  # the worker, no other process, ran it
        pid = int(str(run.infrastructure_pid).rsplit(":", 1)[-1])  # the run's own process
        wait_until(f"run {name}'s process {pid} to end", lambda p=pid: not alive(p), timeout=60)
        assert "promoted as v1.0.0" in out, out
    # the train stages never overlapped (each stage's own start and end), and only one waited
    spans = lines.spans
    assert set(spans) == {"en-de", "de-en"} and all(len(s) == 2 for s in spans.values()), spans
    first, second = sorted(spans.values(), key=lambda s: s["start"])
    assert first["end"] <= second["start"], spans
    waiter = lines.waiter
    assert spans[waiter] == second and "waiting for the cores" not in lines.outs[other(waiter)]
    assert set(lines.tagged) == {"en-de@v1.0.0", "en-de#prod#1", "de-en@v1.0.0", "de-en#prod#1"}
    for name in ("en-de", "de-en"):  # each line in its own workspace, the worker's too
        assert (lines.toy / ".dvc/tmp/flows/lines" / name / "dvc.lock").exists()


@pytest.mark.slow
def test_serve_shows_each_lines_recipe_and_the_machines_turns(two_lines: TwoLines) -> None:
    """One `flows.serve` serves a retrain per line: it prints each line's recipe, gate and
    schedule, makes the machine's train limit, and passes a run the line alone."""
    toy, env = two_lines.toy, two_lines.env
    with served(toy, env, TOY_CORPUS=env["TOY_CORPUS"]) as proc:
        log = proc.log_path.read_text()
        shown = 'retrain/en-de: {"line": "en-de", "recipe": {"preset": "demo", "overrides": []}, '
        assert shown in log, log
        assert '"retrain.margin=0.5"]}, "schedule": "0 4 * * 1"}' in log, log
        # this machine's train stages take turns (flows/cores.py): its limit, made at start
        assert "train stages: 1 at a time on this machine (Prefect concurrency limit " in log
        with client() as c:  # the line alone: each run reads its recipe from its commit
            assert c.read_deployment_by_name("retrain/de-en").parameters == {"line": "de-en"}


@pytest.mark.slow
def test_two_lines_gated_apart_and_fetched_from_the_team_remote(two_lines: TwoLines) -> None:
    """Each line's run promoted as v1 of its own line and pushed to origin; a clone of origin
    fetches each champion; the pipeline run recorded en-de and `flows.promote EXPERIMENT` gates
    it there; a worse candidate of de-en meets de-en's champion only; `make results` is a table
    per line; and the lines' pins (issue 81)."""
    toy, bare, env, tmp_path = two_lines.toy, two_lines.bare, two_lines.env, two_lines.toy.parent
    r = two_lines.pipeline
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
    assert tags(bare, "*") == tags(toy, "*")  # the registry reached the team's remote

    # a clone of the team's remote (not of the serving repository) fetches each champion
    clone = tmp_path / "clone"
    sh("git", "clone", "-q", str(bare), str(clone), cwd=tmp_path)
    for n, steps in (("en-de", 600), ("de-en", 500)):
        get = (*DVC, "artifacts", "get", ".", n, "--stage", "prod", "-o", n, "--remote", "store")
        sh(*get, cwd=clone)
        assert (clone / n / "model.pt").read_text().startswith(f"{steps} ")

    # `python -m flows.promote EXPERIMENT`, as the README says: the pipeline run recorded en-de
    # (its recipe is en-de's, with its own override after it)
    assert registry.record_at(toy, resolve_experiment(toy, pipeline_exp))["line"] == "en-de"
    r = python(["-m", "flows.promote", pipeline_exp], toy, env)
    assert r.returncode == 0 and "promoted as v2.0.0" in r.stdout, r.stdout + r.stderr
    assert "en-de@v2.0.0" in tags(toy, "en-de@*")

    # a worse candidate of de-en meets de-en's champion only; en-de's tags stay as they were
    before = tags(toy, "en-de*", "decision/en-de/*")
    sh(*DVC, "exp", "run", "-q", "-n", "worse", "-S", "train.max_steps=100", cwd=toy, env=env)
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
