"""The Prefect flows against a real Prefect server and real `dvc` in toy git + DVC projects."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from prefect_fixtures import (
    artifact,
    client,
    deployment_run,
    dvc_json,
    make_toy,
    run_id,
    served,
    sh,
)

from flows.dag import Stage, generations, locked_outs, read_dag
from flows.lineage import lineage
from flows.retrain import gate
from flows.shell import apply_params

TERMINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


@pytest.fixture(scope="session")
def toy_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_toy(tmp_path_factory.mktemp("toy-template") / "toy")


@pytest.fixture
def toy(toy_template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the toy project (git history and DVC config included)."""
    return Path(shutil.copytree(toy_template, tmp_path / "toy", symlinks=True))


@pytest.fixture(scope="module")
def controls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The files the toy stages obey, exported to this process and to `serve` alike."""
    d = tmp_path_factory.mktemp("controls")
    files = {
        k: d / k.lower()
        for k in ("TOY_BARRIER", "TOY_FAIL_ONCE", "TOY_RUNLOG", "TOY_HOLD", "TOY_STARTED")
    }
    files["TOY_BARRIER"].mkdir()
    saved = {k: os.environ.get(k) for k in files}
    os.environ.update({k: str(v) for k, v in files.items()})
    yield files
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def project(
    toy_template: Path,
    tmp_path_factory: pytest.TempPathFactory,
    prefect_server: dict,
    controls: dict[str, Path],
) -> Iterator[tuple[Path, subprocess.Popen]]:
    """One toy project served by `python -m flows.serve` for the scenario tests below, in order:
    demo run, retraining, and last the killed worker (which ends the serve process)."""
    toy = Path(
        shutil.copytree(toy_template, tmp_path_factory.mktemp("served") / "toy", symlinks=True)
    )
    with served(toy, prefect_server, **{k: str(v) for k, v in controls.items()}) as proc:
        yield toy, proc


def flow_run(run: str):
    with client() as c:
        return c.read_flow_run(run)


def wait_until(what: str, check, timeout: float = 240.0):
    """Poll `check()` until it returns something truthy; fail naming `what` (no timing asserted)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {what}")


def dead(proc: psutil.Process) -> bool:
    """Gone for good: DVC treats a zombie's PID in its rwlock as a live holder."""
    return not psutil.pid_exists(proc.pid)


def logs(run: str) -> str:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    out, offset = [], 0
    with client() as c:
        while batch := c.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run])), limit=200, offset=offset
        ):
            out += [log.message for log in batch]
            offset += len(batch)
    return "\n".join(out)


def test_dag_is_dvcs_own(toy: Path) -> None:
    dag = read_dag(toy)
    assert [sorted(w) for w in generations(dag)] == [
        ["download"],
        ["stats", "tokenizer"],
        ["train"],
        ["evaluate"],
    ]
    assert dag["evaluate"].metrics == ("data/metrics/evaluate.json",)
    assert dag["train"].plots == ("data/live/plots/metrics",)
    # a stage added to dvc.yaml is scheduled with no code change
    with open(toy / "dvc.yaml", "a") as f:
        f.write(
            "  report:\n    cmd: cp data/stats.json data/report.json\n"
            "    deps: [data/stats.json]\n    outs: [data/report.json]\n"
        )
    assert read_dag(toy)["report"].upstream == ("stats",)


def test_gate_both_ways() -> None:
    sig = {"test_sha256": "t", "bleu_signature": "s"}
    champ = {"bleu": 20.0, **sig}
    assert gate({"bleu": 21.0, **sig}, champ, 0.5)[0]
    keep, why = gate({"bleu": 20.3, **sig}, champ, 0.5)
    assert not keep and "margin 0.5" in why
    keep, why = gate({"bleu": 30.0, **sig, "bleu_signature": "other"}, champ, 0.0)
    assert not keep and "bleu_signature" in why
    keep, why = gate({"bleu": 30.0, **sig, "test_sha256": "new"}, champ, 0.0)
    assert not keep and "test_sha256" in why
    assert gate({"bleu": 1.0, **sig}, None, 0.0) == (True, "no champion yet")
    keep, why = gate({"bleu": None, **sig}, None, 0.0)  # never a champion without a score
    assert not keep and "no BLEU score" in why
    assert gate({"bleu": 1.0, **sig}, {"bleu": None, **sig}, 0.0)[0]
    keep, why = gate({"bleu": 30.0, **sig, "split": "valid"}, champ, 0.0)  # champ: test
    assert not keep and "split differs" in why
    assert gate({"bleu": 30.0, **sig, "split": "test"}, champ, 0.0)[0]


def test_the_scored_split_is_what_lineage_hashes() -> None:
    from flows.lineage import test_set_hash

    manifest = {f"splits/{s}/files/{s}.{lang}/sha256": f"{s}-{lang}"
                for s in ("train", "valid", "test") for lang in ("en", "de")}
    hashes = {s: test_set_hash({}, manifest, s) for s in ("valid", "test")}
    assert None not in hashes.values() and hashes["valid"] != hashes["test"]
    assert test_set_hash({}, manifest) == hashes["test"]
    manifest["splits/valid/files/valid.de/sha256"] = "changed"
    assert test_set_hash({}, manifest, "valid") != hashes["valid"]


def test_overrides_are_applied_and_a_typo_is_named_before_hydra(tmp_path) -> None:
    from transformer.config import ConfigError, load_all, write_preset

    params = tmp_path / "params.yaml"
    write_preset("demo", params)
    apply_params(tmp_path, None, ["train.max_steps=7", "download.clean.max_words=9"])
    loaded = load_all(params)
    assert (loaded["train"].max_steps, loaded["download"].clean.max_words) == (7, 9)
    before = params.read_text()
    with pytest.raises(ConfigError, match=r"unknown key train\.max_step \(valid keys: .*max_steps"):
        apply_params(tmp_path, None, ["train.max_step=100"])  # Hydra would say "+train.max_step"
    with pytest.raises(ConfigError, match=r"unknown section trian"):
        apply_params(tmp_path, None, ["trian.max_steps=1"])
    assert params.read_text() == before


def deployment_runs(name: str, state: str | None = None) -> list:
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )

    with client() as c:
        dep = c.read_deployment_by_name(name)
        runs = c.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[state]))
            )
            if state
            else None,
        )
    return sorted(runs, key=lambda r: r.expected_start_time)


@pytest.mark.slow
def test_demo_deployment_end_to_end(
    project, prefect_server: dict, controls: dict, tmp_path: Path
) -> None:
    """`prefect deployment run pipeline/demo --watch`, then the artifacts and DVC's state."""
    from flows.pipeline import pipeline

    toy, _ = project
    controls["TOY_FAIL_ONCE"].touch()  # the first download fails: the task retries with backoff
    r = deployment_run(
        prefect_server,
        "pipeline/demo",
        "-p",
        'overrides=["train.max_steps=20"]',
        "-p",
        "retry_delay_s=0.1",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run = run_id(r.stdout)
    # the stages' own output streamed into the Prefect logs; tokenizer and stats overlapped
    # (each waits at a barrier for the other), and download ran twice
    assert "toy train: trained 20 steps" in logs(run)
    ran = controls["TOY_RUNLOG"].read_text().split()
    assert sorted(ran) == ["download", "download", "evaluate", "stats", "tokenizer", "train"]
    assert not controls["TOY_FAIL_ONCE"].exists()
    # lineage: the score and the inputs it came from
    table = {row["field"]: row["value"] for row in artifact(run, "lineage")}
    head = sh("git", "rev-parse", "HEAD", cwd=toy).strip()
    assert table["bleu"] == "2.0" and table["chrf"] == "50.0"
    assert table["bleu_signature"].startswith("nrefs:1|")
    assert table["git_revision"].startswith(head)
    assert table["data_hash"].startswith("data/raw=") and ".dir" in table["data_hash"]
    assert "step_00000020.pt" in table["checkpoints_averaged"]
    assert len(table["tokenizer_sha256"]) == 64 and table["test_sha256"] != "None"
    assert "missing" not in table
    curves = artifact(run, "training-curves")
    assert "data/live/plots/metrics/train/loss.tsv | 20 |" in curves
    assert Path(curves.split("](file://")[1].split(")")[0]).is_file()
    # DVC's view: nothing stale, the cache holds every output, the run is an experiment
    assert dvc_json(toy, "status") == {}
    lock, dag = locked_outs(toy), read_dag(toy)
    for stage, outs in lock.items():
        for path, md5 in outs.items():
            if path not in dag[stage].uncached:
                assert (toy / ".dvc/cache/files/md5" / md5[:2] / md5[2:]).exists(), path
    exps = dvc_json(toy, "exp", "show")
    (exp,) = [
        e
        for base in exps
        for e in (base.get("experiments") or [])
        for e in e["revs"]
        if e["name"] == f"pipeline-{flow_run(run).name}"
    ]
    assert exp["data"]["params"]["params.yaml"]["data"]["train"]["max_steps"] == 20
    assert exp["data"]["metrics"]["data/metrics/evaluate.json"]["data"]["bleu"] == 2.0
    # ... and plain `dvc repro` of the same commit and params leaves the very same outputs
    clone = tmp_path / "clone"
    sh("git", "clone", "-q", str(toy), str(clone), cwd=tmp_path)
    shutil.copy(toy / "params.yaml", clone / "params.yaml")
    sh(sys.executable, "-m", "dvc", "repro", cwd=clone)
    assert locked_outs(clone) == lock
    # a second run skips every stage: DVC decides what is stale
    before = controls["TOY_RUNLOG"].read_text()
    result = pipeline(project=str(toy))
    assert set(result["stages"].values()) == {"skipped"}
    assert controls["TOY_RUNLOG"].read_text() == before


@pytest.mark.slow
def test_retrain_schedule_limit_and_gate(project, prefect_server: dict, controls: dict) -> None:
    from prefect.states import Scheduled

    from flows.retrain import retrain

    toy, _ = project
    hold, started, runlog = controls["TOY_HOLD"], controls["TOY_STARTED"], controls["TOY_RUNLOG"]
    started.unlink(missing_ok=True)
    hold.touch()  # the first retrain's train stage waits until the test removes this file
    with open(toy / "corpus/train.txt", "a") as f:  # a new snapshot upstream: train must rerun
        f.write("a first snapshot\n")
    # the cron schedule made a run for next Monday; start it now instead
    first = wait_until(
        "a scheduled retrain run", lambda: deployment_runs("retrain/retrain", "SCHEDULED")
    )[0]
    assert first.auto_scheduled and first.expected_start_time > first.created
    with client() as c:
        c.set_flow_run_state(first.id, Scheduled(scheduled_time=first.created), force=True)
    try:
        wait_until("the scheduled run to train", started.exists)
        # a second retrain while the first trains waits for the concurrency slot
        second = run_id(deployment_run(prefect_server, "retrain/retrain", watch=False).stdout)
        wait_until(
            "the second run to wait for its slot",
            lambda: flow_run(second).state.name == "AwaitingConcurrencySlot",
        )
        assert flow_run(first.id).state.type.value == "RUNNING"
    finally:
        hold.unlink()
    for run in (first.id, second):
        wait_until(f"run {run} to finish",
                   lambda run=run: flow_run(run).state.type.value in TERMINAL)
    a, b = flow_run(first.id), flow_run(second)
    assert a.state.is_completed() and b.state.is_completed()
    assert b.start_time >= a.end_time  # never both at once
    champion_file = toy / "models/champion.json"
    champion = json.loads(champion_file.read_text())
    bleu = json.loads((toy / "data/metrics/evaluate.json").read_text())["bleu"]
    assert champion["bleu"] == bleu and champion["reason"] == "no champion yet"
    assert "promoted" in artifact(str(first.id), "retrain-decision")
    # the second run found the same data: nothing retrained
    assert "nothing retrained" in artifact(second, "retrain-decision")

    # a worse candidate on new data: trained, compared, champion kept
    with open(toy / "corpus/train.txt", "a") as f:
        f.write("a refreshed snapshot\n")
    trained = runlog.read_text().split().count("train")
    out = retrain(project=str(toy), overrides=[f"train.max_steps={int(bleu * 10) // 2}"])
    assert out["retrained"] and not out["promoted"] and "champion kept" in out["reason"]
    assert runlog.read_text().split().count("train") == trained + 1
    assert json.loads(champion_file.read_text()) == champion
    # a better one on newer data, by more than the margin: promoted
    with open(toy / "corpus/train.txt", "a") as f:
        f.write("another snapshot\n")
    out = retrain(
        project=str(toy), overrides=[f"train.max_steps={int(bleu * 10) + 60}", "retrain.margin=5"]
    )
    assert out["promoted"], out["reason"]
    new = json.loads(champion_file.read_text())
    assert new["bleu"] == bleu + 6 and new["data_hash"] != champion["data_hash"]
    assert new["overrides"] == [f"train.max_steps={int(bleu * 10) + 60}", "retrain.margin=5"]
    assert (
        new["experiment_commit"]
        == sh("git", "rev-parse", new["experiment_commit"], cwd=toy).strip()
    )


@pytest.mark.slow
def test_killed_worker_then_rerun(project, prefect_server: dict, controls: dict) -> None:
    """Runs last: it kills this module's serve process, as if its machine died."""
    from flows.pipeline import pipeline

    toy, proc = project
    hold, started = controls["TOY_HOLD"], controls["TOY_STARTED"]
    started.unlink(missing_ok=True)
    hold.touch()
    overrides = ["train.max_steps=30"]  # train and evaluate must run again
    deployment_run(
        prefect_server, "pipeline/demo", "-p", f"overrides={json.dumps(overrides)}", watch=False
    )
    wait_until("train to start", started.exists)
    victims = [proc, *psutil.Process(proc.pid).children(recursive=True)]
    for p in victims:
        os.kill(p.pid, signal.SIGKILL)
    proc.wait()
    wait_until("the killed processes to be gone", lambda: all(map(dead, victims[1:])))
    hold.unlink()
    # DVC tells the truth: finished stages are recorded, the killed one and its downstream not
    status = dvc_json(toy, "status")
    assert {"train", "evaluate"} <= set(status) and not {"download", "tokenizer"} & set(status)
    assert any("changed outs" in change for change in status["train"])  # the half-written dir
    assert (toy / "data/checkpoints/step_00000001.pt").read_text() == "partial"
    # the rerun (here in this process) completes and leaves DVC clean
    result = pipeline(preset="demo", overrides=overrides, project=str(toy))
    assert result["stages"]["train"] == "ran" and dvc_json(toy, "status") == {}
    assert (toy / "data/checkpoints/step_00000030.pt").exists()


def test_lineage_records_the_shards_a_model_was_trained_on(tmp_path):
    """With BPE-dropout the shards do not follow from data + tokenizer: their hash is kept too."""
    lock = {"download": ("data/raw", "a1.dir"), "shard": ("data/shards", "b2.dir")}
    dag, stages = {}, {}
    for name, (out, md5) in lock.items():
        metric = f"data/metrics/{name}.json"
        dag[name] = Stage(name, (), (out, metric), (metric,), (), (metric,))
        outs = [{"path": out, "md5": md5}, {"path": metric, "md5": "0" * 32}]
        stages[name] = {"cmd": "true", "outs": outs}
    (tmp_path / "dvc.lock").write_text(json.dumps({"schema": "2.0", "stages": stages}))
    record = lineage(tmp_path, dag)
    assert record["data_hash"] == "data/raw=a1.dir"
    assert record["shards_hash"] == "data/shards=b2.dir"  # the metrics file is not an output
    assert lineage(tmp_path, {"download": dag["download"]})["shards_hash"] is None
