"""What a first user sees, on the toy project with a real Prefect server on 127.0.0.1 and a real
DVC remote on a local path: docs/orchestration.md's walkthrough, its commands read from the doc
and run as they are written (serve without a remote, --local-only, a run and a promotion through
`flows.run --wait`, a remote added, publish, a second clone fetching the champion), what each
prints, and `make results` in that clone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import forked
from helpers.docs import readme_fetch, readme_orchestration, shipped_lines, walkthrough
from prefect_fixtures import BIN, DVC, client, make_toy, run_id, served, sh


def runnable(argv: list[str], subst: dict[str, str]) -> list[str]:
    """The doc's argv as this venv runs it: python and dvc are the venv's, placeholders filled."""
    head = {"python": [sys.executable], "dvc": list(DVC)}.get(argv[0], [argv[0]])
    if argv[0] == "transformer-translate":
        head = [str(BIN / argv[0])]
    for key, value in subst.items():
        argv = [a.replace(key, value) for a in argv]
    return head + argv[1:]


def run(argv: list[str], cwd: Path, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow
def test_a_first_user_from_local_only_to_the_champion_in_another_clone(
    prefect_server: dict, tmp_path: Path
) -> None:
    steps = walkthrough()
    assert [a[:3] for a in steps] == [
        ["python", "-m", "flows.serve"],
        ["python", "-m", "flows.serve"],
        ["python", "-m", "flows.run"],
        ["python", "-m", "flows.run"],
        ["dvc", "remote", "add"],
        ["git", "commit", "-m"],
        ["python", "-m", "flows.registry"],
        ["git", "clone", "/srv/transformer-pipeline"],
        ["cd", "other-clone"],
        ["dvc", "artifacts", "get"],
        ["transformer-translate", "--model", "champion"],
    ]
    serve, local_only, demo, promote, remote, commit, publish, clone, _, fetch, _ = steps
    assert fetch == readme_fetch()  # the README's command is the doc's
    toy = make_toy(tmp_path / "toy")
    # the shipped project's lines (en-de and de-en, each using the other), as dvc.yaml has them
    (toy / "dvc.yaml").write_text(shipped_lines((toy / "dvc.yaml").read_text()))
    sh("git", "commit", "-qam", "the shipped lines", cwd=toy)
    params = (toy / "params.yaml").read_bytes()
    corpus = str(toy.parent / "corpus")
    env = {**prefect_server, "TOY_CORPUS": corpus, "PYTHONPATH": str(toy)}
    other = tmp_path / "other-clone"
    subst = {"/srv/dvc-store": str(tmp_path / "remote"), "/srv/transformer-pipeline": str(toy)}
    subst["other-clone"] = str(other)

    refused = run(runnable(serve, subst), toy, env, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "no default DVC remote" in refused.stderr and "--local-only" in refused.stderr
    with served(toy, env, *local_only[3:], TOY_CORPUS=corpus) as proc:
        assert "--local-only: no default DVC remote" in proc.log_path.read_text()
        r = run(runnable(demo, subst), toy, env)
        assert r.returncode == 0, r.stdout + r.stderr
        found = re.search(r"experiment (pipeline-\S+): BLEU 60\.00 \(through the gate: ", r.stdout)
        assert found, r.stdout
        name = subst["NAME"] = found.group(1)
        assert f"python -m flows.promote {name})" in r.stdout
        r = run(runnable(promote, subst), toy, env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"experiment {name}: BLEU 60.00; promoted as v1.0.0: no champion yet" in r.stdout
        assert "warning: no default DVC remote: the champion is in this machine's" in r.stdout
        r = run(runnable(promote, subst), toy, env)  # again: refused, and the run Completed
        assert r.returncode == 0 and "refused: the candidate is the champion already" in r.stdout
        bad = ["-p", 'overrides=["train.max_step=5"]', "--wait"]
        r = run([sys.executable, "-m", "flows.run", "pipeline/demo", *bad], toy, env)
        assert r.returncode == 1 and "unknown key train.max_step" in r.stdout, r.stdout
        failed = re.search(r"started flow run (\S+) of pipeline/demo", r.stdout).group(1)
        with client() as c:  # the server's record says so too
            state = c.read_flow_run(run_id(r.stdout)).state
        assert state.is_failed() and "unknown key train.max_step" in state.message
        assert (toy / "params.yaml").read_bytes() == params and not sh(
            "git", "status", "--porcelain", cwd=toy
        )

    sh(*runnable(remote, subst), cwd=toy)
    sh(*runnable(commit, subst), cwd=toy)
    out = sh(*runnable(publish, subst), cwd=toy, env=env)
    assert "v1.0.0: published" in out, out
    sh(*runnable(clone, subst), cwd=tmp_path)
    sh(*runnable(fetch, subst), cwd=other)  # its commit predates the remote: --remote store
    assert (other / "champion/model.pt").read_text().startswith("600 ")

    # the second clone has the tags, not the experiments: make results lists the decisions
    # (and the failed run, from the Prefect server), within 120 columns, and says what to fetch
    r = run([sys.executable, "-m", "flows.results"], other, env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 120, r.stdout
    (champ,) = [line for line in lines if line.startswith("*")]  # a table per line
    assert champ.split()[:5] == ["*", name, "v1.0.0", "60.00", "-"], r.stdout
    assert "promoted as v1.0.0" in champ  # the rest may be cut to 120 columns: --wide below
    assert f"(run {failed})" in r.stdout and "failed: " in r.stdout
    assert "dvc exp pull origin --all-commits --no-cache" in lines[-1]
    sh(*DVC, "exp", "pull", "origin", "--all-commits", "--no-cache", cwd=other)
    r = run([sys.executable, "-m", "flows.results", "--wide"], other, env)
    row = next(line for line in r.stdout.splitlines() if name in line)
    # the toy train stage records a second a step: 600 steps, 0:10:00
    assert row.split()[:8] == ["*", name, "v1.0.0", "-", "demo", "60.00", "600", "0:10:00"], row
    assert "promoted as v1.0.0: no champion yet; refused:" in row, row
    print(r.stdout)  # the doc's example


@pytest.mark.slow
def test_the_readmes_orchestration_block_runs_as_written(prefect_server: dict, tmp_path: Path):
    """README.md's orchestration block, read from the file, on the toy project with the shipped
    dvc.yaml's lines (en-de and de-en, each using the other): every command as written."""
    steps = readme_orchestration()
    assert [a[:3] for a in steps] == [
        ["dvc", "remote", "add"],
        ["git", "commit", "-m"],
        ["prefect", "server", "start"],
        ["python", "-m", "flows.serve"],
        ["python", "-m", "flows.run"],
        ["python", "-m", "flows.run"],
        ["python", "-m", "flows.promote"],
        ["make", "results"],
        ["dvc", "artifacts", "get"],
    ]
    remote, commit, server, serve, demo, retrain, promote, results, fetch = steps
    assert "127.0.0.1" in server  # the test's own server is one such (prefect_server)
    toy = make_toy(tmp_path / "toy")
    (toy / "dvc.yaml").write_text(shipped_lines((toy / "dvc.yaml").read_text()))
    sh("git", "commit", "-qam", "the shipped lines", cwd=toy)
    corpus = str(toy.parent / "corpus")
    env = {**prefect_server, "TOY_CORPUS": corpus, "PYTHONPATH": str(toy)}
    subst = {"/srv/dvc-store": str(tmp_path / "remote")}
    sh(*runnable(remote, subst), cwd=toy)
    sh(*runnable(commit, subst), cwd=toy)
    with served(toy, env, *serve[3:], TOY_CORPUS=corpus) as proc:
        assert "retrain/en-de" in proc.log_path.read_text()
        r = run(runnable(demo, subst), toy, env)
        assert r.returncode == 0, r.stdout + r.stderr
        found = re.search(r"experiment (pipeline-\S+): BLEU 10\.00 \(through the gate: ", r.stdout)
        assert found, r.stdout
        subst["EXPERIMENT"] = found.group(1)
        r = run(runnable(retrain, subst), toy, env)
        assert r.returncode == 0 and "promoted as v1.0.0: " in r.stdout, r.stdout
        # the line uses de-en's champion: the retrain pins it (none yet), trains without it,
        # and says so (a pipeline run's champion, which pinned nothing, then makes the next
        # retrain train: test_flows_lines)
        assert "using backward de-en: no champion yet, trained without it" in r.stdout, r.stdout
        assert "trained without it; no champion yet" in r.stdout, r.stdout
        r = run(runnable(promote, subst), toy, env)  # the line its run recorded: en-de's gate
        assert r.returncode == 3, r.stdout + r.stderr
        assert "not promoted: candidate BLEU 10.00 does not beat champion 60.00" in r.stdout
    assert results == ["make", "results"]  # the Makefile's target runs this:
    r = run([sys.executable, "-m", "flows.results"], toy, env)
    assert r.returncode == 0 and "line en-de: champion en-de@v1.0.0" in r.stdout, r.stdout
    sh(*runnable(fetch, subst), cwd=toy)
    assert (toy / "champion/model.pt").read_text().startswith("600 ")


def test_a_run_that_went_on_from_another_runs_checkpoints_says_so_with_its_own_time(
    tmp_path: Path,
) -> None:
    """The run workspace keeps one set of checkpoints, and a run that differs from the last only
    in max_steps goes on from them: the real train stage records from which run, at which step
    (a retry of its own keeps that), and make results counts only the run's own seconds."""
    import json

    from helpers.train import write_params

    from flows import results
    from transformer import download, shard, tokenizer

    p = str(write_params(tmp_path / "params.yaml", max_steps=4))
    download.main([str(tmp_path / "raw"), "--params", p])
    tokenizer.main([str(tmp_path / "raw"), str(tmp_path / "tok"), "--params", p])
    shard.main(
        [str(tmp_path / "raw"), str(tmp_path / "tok"), str(tmp_path / "shards"), "--params", p]
    )
    live = tmp_path / "live"

    def train(run_name: str, steps: int) -> dict:
        params = write_params(tmp_path / f"{run_name}-{steps}.yaml", max_steps=steps)
        args = [tmp_path / d for d in ("shards", "tok", "ckpt")]
        args += ["--live", live, "--params", params, "--no-progress", "--resume"]
        env = {"TRANSFORMER_RUN": run_name}
        code, out, err = forked.run("transformer.train", *args, env=env)
        assert code == 0, out + err
        return json.loads((live / "metrics.json").read_text())

    first = train("pipeline-a", 4)
    assert "origin" not in first  # a fresh run
    second = train("pipeline-b", 8)  # goes on from a's step 4
    origin = second["origin"]
    assert origin["from"] == "pipeline-a" and origin["step"] == 4, second
    third = train("pipeline-b", 10)
    assert third["origin"] == origin  # its own resume keeps where it began
    flat = results.flatten(third)
    seconds, began = results.own_time(flat, "pipeline-b")
    assert began == "started from pipeline-a at step 4"
    assert seconds == pytest.approx(flat["train/seconds"] - origin["seconds"])
