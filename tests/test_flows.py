"""The Prefect flows against a real Prefect server and real `dvc` in toy git + DVC projects."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prefect import flow
from prefect_fixtures import (
    DVC,
    artifact,
    client,
    copy_toy,
    deployment_run,
    dvc_json,
    fetch_champion,
    flows_run,
    git_init,
    make_toy,
    run_id,
    run_logs,
    served,
    sh,
    wait_until,
)

from flows.dag import Stage, generations, locked_outs, read_dag
from flows.decision import gate
from flows.lineage import Snapshot, lineage
from flows.pipeline import MAX_ATTEMPTS, start_attempt
from flows.shell import CommandError, apply_params, dvc, run
from flows.workspace import WORKSPACE, prepare, reap, release_dead_locks, share_cache

TERMINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


@pytest.fixture(scope="session")
def toy_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_toy(tmp_path_factory.mktemp("toy-template") / "toy")


@pytest.fixture
def toy(toy_template: Path, tmp_path: Path) -> Path:
    return copy_toy(toy_template, tmp_path / "toy")


@pytest.fixture(scope="module")
def controls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The files the toy stages obey, exported to this process and to `serve` alike."""
    d = tmp_path_factory.mktemp("controls")
    files = {
        k: d / k.lower()
        for k in (
            "TOY_BARRIER",
            "TOY_FAIL_ONCE",
            "TOY_RUNLOG",
            "TOY_HOLD",
            "TOY_STARTED",
            "TOY_FAIL_TRAIN",
            "TOY_OOM_TRAIN",
        )
    }
    files["TOY_BARRIER"].mkdir()
    saved = {k: os.environ.get(k) for k in files}
    os.environ.update({k: str(v) for k, v in files.items()})
    yield files
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@dataclass
class Served:
    path: Path  # the user's checkout
    env: dict[str, str]  # what the serve process was given
    params_before: bytes  # params.yaml before any run
    serve: subprocess.Popen


@pytest.fixture(scope="module")
def project(
    toy_template: Path,
    tmp_path_factory: pytest.TempPathFactory,
    prefect_server: dict,
    controls: dict[str, Path],
) -> Iterator[Served]:
    """One toy project with a DVC remote, served by `python -m flows.serve`, for the scenario
    tests below. They run in any order: each takes the state it needs from the `fresh` or
    `champion` fixture."""
    toy = copy_toy(toy_template, tmp_path_factory.mktemp("served") / "toy")
    sh(*DVC, "remote", "add", "-d", "store", str(toy.parent / "remote"), cwd=toy)
    sh("git", "commit", "-qam", "a DVC remote", cwd=toy)
    env = {**{k: str(v) for k, v in controls.items()}, "TOY_CORPUS": str(toy.parent / "corpus")}
    saved = os.environ.get("TOY_CORPUS")
    os.environ["TOY_CORPUS"] = env["TOY_CORPUS"]
    with served(toy, prefect_server, **env) as proc:
        yield Served(toy, env, (toy / "params.yaml").read_bytes(), proc)
    os.environ.pop("TOY_CORPUS") if saved is None else os.environ.__setitem__("TOY_CORPUS", saved)


def clear_registry(toy: Path) -> None:
    """No champion, no decision: every tag (the registry's only state) deleted."""
    if names := sh("git", "tag", "--list", cwd=toy).split():
        sh("git", "tag", "-d", *names, cwd=toy)


@pytest.fixture
def fresh(project: Served, controls: dict[str, Path]) -> Served:
    """The served project as if no run had happened: no registry tags, no run workspace, an
    empty DVC cache (nothing for the run-cache to restore) and an empty stage log."""
    toy = project.path
    clear_registry(toy)
    if (toy / WORKSPACE).exists():
        sh("git", "worktree", "remove", "--force", str(toy / WORKSPACE), cwd=toy)
    shutil.rmtree(toy / ".dvc" / "cache", ignore_errors=True)
    controls["TOY_RUNLOG"].write_text("")
    return project


@pytest.fixture(scope="module")
def champion_tags(project: Served, controls: dict[str, Path]) -> list[tuple[str, str]]:
    """v1.0.0 at BLEU 60, as the first scheduled retrain makes it (the demo recipe, retrained
    in-process), built once per module: the tag refs it left, (object, ref)."""
    from flows import registry
    from flows.retrain import retrain

    clear_registry(project.path)
    out = retrain(preset="demo", project=str(project.path))
    assert out["promoted"] and registry.champion(project.path)["bleu"] == 60.0, out["reason"]
    refs = sh(
        "git", "for-each-ref", "refs/tags", "--format=%(objectname) %(refname)", cwd=project.path
    )
    return [tuple(line.split()) for line in refs.splitlines()]


@pytest.fixture
def champion(project: Served, champion_tags: list[tuple[str, str]]) -> Served:
    """The served project whose registry holds exactly the v1.0.0 champion at BLEU 60."""
    clear_registry(project.path)
    for obj, ref in champion_tags:
        sh("git", "update-ref", ref, obj, cwd=project.path)
    return project


def flow_run(run: str):
    with client() as c:
        return c.read_flow_run(run)


def finished(run: str):
    def ended():
        read = flow_run(run)
        return read.state.type.value in TERMINAL and read

    return wait_until(f"run {run} to finish", ended, every=1.0)


def logs(run: str) -> str:
    return "\n".join(run_logs(run))


def untouched(project: Served) -> None:
    """The user's checkout shows nothing a run made: params.yaml as it was, git status clean."""
    assert (project.path / "params.yaml").read_bytes() == project.params_before
    assert sh("git", "status", "--porcelain", cwd=project.path) == ""


def tags(toy: Path) -> list[str]:
    return sh("git", "tag", "--list", "transformer*", cwd=toy).split()


def promote_cli(experiment: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """`python -m flows.promote EXPERIMENT`, its exit code and output kept for the assertions."""
    cmd = [sys.executable, "-m", "flows.promote", experiment]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def test_dag_is_dvcs_own(toy: Path) -> None:
    dag = read_dag(toy)
    assert [sorted(w) for w in generations(dag)] == [
        ["download"],
        ["stats", "tokenizer"],
        ["train"],
        ["evaluate"],
        ["package"],
    ]
    assert dag["evaluate"].metrics == ("data/metrics/evaluate.json",)
    assert dag["train"].plots == ("data/live/plots/metrics",)
    # a stage added to dvc.yaml is scheduled with no code change
    with open(toy / "dvc.yaml") as f:
        text = f.read()
    (toy / "dvc.yaml").write_text(
        text.replace(  # the last entry of `stages:`, which the top-level `plots:` follows
            "\nplots:\n",
            (
                "\n  report:\n    cmd: cp data/stats.json data/report.json\n"
                "    deps: [data/stats.json]\n    outs: [data/report.json]\nplots:\n"
            ),
            1,
        )
    )
    assert read_dag(toy)["report"].upstream == ("stats",)


def test_gate_both_ways() -> None:
    sig = {"test_sha256": "t", "bleu_signature": "s", "split": "test"}
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
    keep, why = gate({"bleu": 30.0, **sig, "split": "valid"}, champ, 0.0)
    assert not keep and "split differs" in why


def test_the_scored_split_is_what_lineage_hashes() -> None:
    from flows.lineage import test_set_hash

    manifest = {
        f"splits/{s}/files/{s}.{lang}/sha256": f"{s}-{lang}"
        for s in ("train", "valid", "test")
        for lang in ("en", "de")
    }
    hashes = {s: test_set_hash({}, manifest, s) for s in ("valid", "test")}
    assert None not in hashes.values() and hashes["valid"] != hashes["test"]
    assert test_set_hash({}, manifest) == hashes["test"]
    manifest["splits/valid/files/valid.de/sha256"] = "changed"
    assert test_set_hash({}, manifest, "valid") != hashes["valid"]


def test_overrides_are_applied_and_a_typo_changes_nothing(tmp_path) -> None:
    from transformer.core.presets import load_all, write_preset
    from transformer.core.settings import ConfigError

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
    with pytest.raises(ConfigError, match=r"unknown key train\.max_step"):
        apply_params(tmp_path, "multi30k-en-de", ["train.max_step=1"])  # preset not written
    assert params.read_text() == before


def test_stage_output_reaches_the_log_at_a_bounded_rate(tmp_path, caplog) -> None:
    """Progress-bar refreshes (lines ended by \\r, or a bar a line was printed after) and
    repeats of a message are rate-limited; DVC's git advice and blank lines dropped; indented JSON logged as one line; a
    failure names its last error line first."""
    script = (
        "import json, sys, time\n"
        "print('real line 1', flush=True)\n"
        "for i in range(3000):\n"
        "    sys.stderr.write(f'\\r{i}/3000 [bar]'); sys.stderr.flush(); time.sleep(0.0005)\n"
        "sys.stderr.write('\\r3000/3000 [bar]\\n')\n"
        "sys.stderr.write('\\r 50%|#####     | 50/100 [00:01<00:01, 9.10step/s, loss=2.1]')\n"
        "sys.stderr.flush()\n"
        "print('step 50: saved data/checkpoints/step_00000050.pt')\n"
        "sys.stderr.write('\\r' + ' ' * 60 + 'WARNING x: ProtocolError; retrying in 0.5 s\\n')\n"
        "print('    raise SystemExit(3)')\n"
        "print('warning: other processes used 1.6 of 2 cores')\n"
        "print('warning: other processes used 1.2 of 2 cores')\n"
        "print()\n"
        "print('  ')\n"
        "print(json.dumps({'bleu': 1.5, 'signatures': {'bleu': 'nrefs:1'}}, indent=2))\n"
        "print('To track the changes with git, run:')\n"
        "print('\\tgit add dvc.lock')\n"
        "print('error: data/x.bin: not a shard (bad magic)')\n"
        "print('Traceback follows? no: the cause is the line above')\n"
        "print(\"ERROR: failed to reproduce 'shard': failed to run: python shard.py\")\n"
        "sys.exit(3)\n"
    )
    caplog.set_level(logging.INFO, logger="flows")
    with pytest.raises(CommandError) as e:
        run([sys.executable, "-c", script], tmp_path, "stage shard", progress_every_s=3600)
    logged = [r.getMessage() for r in caplog.records if r.name == "flows"][1:]  # after "$ cmd"
    assert "real line 1" in logged and "3000/3000 [bar]" in logged  # the bar's final state
    assert len([m for m in logged if "[bar]" in m]) == 2  # the first refresh and the last line
    # a line printed after a bar's refresh is a line of its own; the refresh is rate-limited
    assert "step 50: saved data/checkpoints/step_00000050.pt" in logged
    assert not any("50/100" in m for m in logged)
    # a line over a bar cleared with spaces is the line alone; an indented one keeps its indent
    assert "WARNING x: ProtocolError; retrying in 0.5 s" in logged
    assert "    raise SystemExit(3)" in logged
    assert len([m for m in logged if m.startswith("warning: other")]) == 1  # repeats: 1 a minute
    assert '{"bleu": 1.5, "signatures": {"bleu": "nrefs:1"}}' in logged  # metrics: one line
    assert not any(m.strip() in ("", "{", "}") for m in logged)  # no blank lines
    assert not any("git add" in m or "To track" in m for m in logged)
    assert str(e.value).startswith("stage shard failed: error: data/x.bin: not a shard")
    assert not e.value.transient and not e.value.lock_busy


@pytest.mark.parametrize("then", ["", " && true"], ids=["exec", "waited"])
def test_a_stage_killed_by_a_signal_is_worth_a_retry(tmp_path, then) -> None:
    """An OOM kill or `kill -9` of a stage's own process: real DVC reports it (`exited with -9`
    when its shell exec'd the command, `exited with 137` when the shell waited for it, as some
    shells do even for one command), and the flows retry the stage (the soak's fault)."""
    git_init(tmp_path)
    sh(*DVC, "init", "-q", cwd=tmp_path)
    kill = "python -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'" + then
    (tmp_path / "dvc.yaml").write_text(f"stages:\n  oom:\n    cmd: {kill}\n    outs: [x]\n")
    with pytest.raises(CommandError) as e:
        dvc("repro", cwd=tmp_path, what="stage oom")
    assert e.value.transient, str(e.value)


def test_a_run_cache_race_between_two_workspaces_is_worth_a_retry() -> None:
    """Two lines' workspaces repro the same stage into one cache at once: DVC's run cache lets one
    delete the other's half-written entry, whose stage then fails on the file gone (the two-lines
    scenario's error, verbatim). Retried; a missing file of the stage's own is not."""
    key = "f101deeeac5e9819e30080fa37ac4e5f0ee30d8e3c88aea68bdcf90ecf151b4f"
    tmp = f"/tmp/p/toy/.dvc/cache/runs/f1/{key}/.Pyt_DsdpO-VkXBWaiKF0aQ.tmp"
    raced = f"ERROR: failed to reproduce 'stats': [Errno 2] No such file or directory: '{tmp}'"
    missing = (
        "ERROR: failed to reproduce 'shard': [Errno 2] No such file or directory: 'data/corpus'"
    )
    cmd = ["dvc", "repro", "--single-item", "stats"]
    assert CommandError("stage stats", cmd, 255, ["toy stats: start", raced]).transient
    assert not CommandError("stage shard", cmd, 255, [missing]).transient


RANKS = """
import os, signal, sys, time
if os.environ["RANK"] == "0":
    time.sleep(1)  # both ranks up: the agent then stops rank 1 with SIGTERM
    if sys.argv[1] == "oom":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit("error: data/shards/train/0.bin: not a shard (bad magic)")
time.sleep(120)
"""


@pytest.mark.slow  # two real torchrun agents
@pytest.mark.parametrize("fault", ["error", "oom"])
def test_a_rank_s_own_error_is_not_retried_for_the_ranks_torchrun_stopped(tmp_path, fault):
    """One of two ranks fails: torchrun's agent stops the other (SIGTERM, listed under
    "Failures:") and names the first failure its root cause. A bad shard is worth no retry,
    however the stopped rank died; a rank killed by the kernel is."""
    (tmp_path / "ranks.py").write_text(RANKS)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    with pytest.raises(CommandError) as e:
        run([*torchrun, "--nproc_per_node=2", "ranks.py", fault], tmp_path, "stage train")
    printed = str(e.value)
    assert "exitcode  : -15" in printed and "Root Cause" in printed  # torchrun's own summary
    assert e.value.transient == (fault == "oom"), printed
    if fault == "error":
        assert "stage train failed: error: data/shards/train/0.bin: not a shard" in printed


def test_serving_without_a_remote_needs_local_only(tmp_path, capsys) -> None:
    """No default DVC remote: `flows.serve` refuses to start, naming the fix, unless told
    --local-only; with a remote it starts."""
    from flows.serve import recipe_args

    git_init(tmp_path)
    sh(*DVC, "init", "-q", cwd=tmp_path)
    with pytest.raises(SystemExit) as e:
        recipe_args([], "python -m flows.serve", "", tmp_path)
    assert e.value.code == 2 and "dvc remote add -d store URL" in capsys.readouterr().err
    assert recipe_args(["--local-only"], "python -m flows.serve", "", tmp_path).local_only
    sh(*DVC, "remote", "add", "-d", "store", str(tmp_path / "remote"), cwd=tmp_path)
    assert not recipe_args([], "python -m flows.serve", "", tmp_path).local_only


def test_reap_ends_what_a_crashed_attempt_left_in_the_workspace(tmp_path) -> None:
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    left = subprocess.Popen(["sleep", "600"], cwd=ws / "data", start_new_session=True)
    outside = subprocess.Popen(["sleep", "600"], cwd=tmp_path, start_new_session=True)
    try:
        assert reap(ws) == [left.pid]
        assert left.wait(10) == -signal.SIGTERM
        assert outside.poll() is None
    finally:
        for p in (left, outside):
            p.kill()
            p.wait()


def test_the_workspace_shares_the_projects_cache_and_local_config(tmp_path) -> None:
    project, ws = tmp_path / "project", tmp_path / "ws"
    for d in (project, ws):
        d.mkdir()
        sh("git", "init", "-q", cwd=d)
        sh(*DVC, "init", "-q", cwd=d)
    sh(*DVC, "remote", "add", "--local", "store", str(tmp_path / "remote"), cwd=project)
    sh(*DVC, "cache", "dir", "--local", str(tmp_path / "elsewhere"), cwd=project)
    share_cache(project, ws)
    # what DVC itself reads in the workspace: the project's cache directory and remote
    assert sh(*DVC, "cache", "dir", cwd=ws).strip() == str(tmp_path / "elsewhere")
    assert sh(*DVC, "remote", "list", cwd=ws).split() == ["store", str(tmp_path / "remote")]


def test_locks_of_dead_processes_are_released(tmp_path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    rwlock = tmp_path / ".dvc/tmp/rwlock"
    rwlock.parent.mkdir(parents=True)
    alive, dead = {"pid": os.getpid(), "cmd": "dvc repro"}, {"pid": gone.pid, "cmd": "dvc repro"}
    rwlock.write_text(
        json.dumps(
            {
                "read": {"data/raw": [alive, dead], "data/shards": [dead]},
                "write": {"data/checkpoints": dead, "data/eval": alive},
            }
        )
    )
    assert release_dead_locks(tmp_path) == [gone.pid]
    assert json.loads(rwlock.read_text()) == {
        "read": {"data/raw": [alive]},
        "write": {"data/eval": alive},
    }


@pytest.mark.parametrize("cut", ["", "schema: '2.0'\nstages:\n  download:\n    cmd: [", "\xff"])
def test_a_lock_file_cut_by_a_kill_is_set_aside(toy: Path, cut: str) -> None:
    """The soak's finding: kill -9 while DVC wrote dvc.lock left it empty, and every later run
    failed on it. The next run's workspace moves it aside and DVC reads the workspace again."""
    ws, _ = prepare(toy, "HEAD")
    (ws / "dvc.lock").write_bytes(cut.encode("latin-1"))
    (ws / ".dvc/tmp").mkdir(exist_ok=True)
    (ws / ".dvc/tmp/rwlock").write_text('{"read": {"data/raw": [{"pid"')
    ws, _ = prepare(toy, "HEAD")
    assert (ws / "dvc.lock.unreadable").read_bytes() == cut.encode("latin-1")
    assert not (ws / "dvc.lock").exists() and not (ws / ".dvc/tmp/rwlock").exists()
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "status"], cwd=ws, capture_output=True, text=True, check=False
    )
    assert status.returncode == 0 and "changed" in status.stdout, status.stderr


@flow(retries=MAX_ATTEMPTS, retry_delay_seconds=0)
def _keeps_crashing() -> None:
    start_attempt()
    raise OSError("No space left on device (simulated)")


def test_attempts_are_bounded(prefect_server: dict) -> None:
    """A run that keeps failing stops at MAX_ATTEMPTS, saying why (a real Prefect run, whose
    retries count its attempts as the rescheduling automation's do)."""
    state = _keeps_crashing(return_state=True)
    assert state.is_failed()
    with pytest.raises(RuntimeError, match=f"giving up after {MAX_ATTEMPTS} attempts"):
        state.result()


def test_promote_counts_its_attempts(prefect_server: dict, tmp_path: Path) -> None:
    """The promote flow bounds its attempts as the pipeline's and retrain's do: its attempt
    MAX_ATTEMPTS + 1 gives up before deciding anything."""
    from flows.promote import promote

    git_init(tmp_path)
    again = promote.with_options(retries=MAX_ATTEMPTS, retry_delay_seconds=0)
    state = again(experiment="no-such-experiment", project=str(tmp_path), return_state=True)
    assert state.is_failed()
    with pytest.raises(RuntimeError, match=f"giving up after {MAX_ATTEMPTS} attempts"):
        state.result()


def test_every_served_flow_is_rescheduled_and_counts_its_attempts() -> None:
    """The flows `flows.serve` deploys are those the retry automation watches, and each one
    bounds its attempts (a flow added to serve.py without either would fail here)."""
    import inspect

    from flows.automations import FLOWS
    from flows.serve import specs

    served_flows = {f.name: f for f, _, _ in specs(project=Path(__file__).parents[1])}
    assert set(served_flows) == set(FLOWS)
    for name, f in served_flows.items():
        assert "start_attempt()" in inspect.getsource(f.fn), name


def test_a_crashing_promote_run_is_not_rescheduled_past_the_attempt_limit(
    prefect_server: dict,
) -> None:
    """The automation "retry crashed runs" reschedules a crash on attempts 1 to MAX_ATTEMPTS - 1
    of any flow it watches, never on the last: a promote run that crashes on every attempt (its
    states set through the API, as `_orphaned` and the zombie automation set them) stays Crashed
    after MAX_ATTEMPTS. A run that crashes after it is rescheduled: so the automation had seen
    the last crash (it reads the server's events in order) and let it be."""
    from prefect.states import Crashed, Running

    from flows import automations
    from flows.promote import promote

    automations.install()

    def crash(run_id, attempt: int) -> None:
        c.set_flow_run_state(run_id, Running(), force=True)
        c.set_flow_run_state(run_id, Crashed(message=f"attempt {attempt} died"), force=True)

    def state_name(run_id) -> str:
        return c.read_flow_run(run_id).state.name

    with client() as c:
        # a deployment no process serves: the automation reschedules only deployments' runs
        flow_id = c.create_flow_from_name(promote.name)
        deployment = c.create_deployment(flow_id, "crashes-every-time")
        run = c.create_flow_run_from_deployment(deployment, parameters={"experiment": "crashes"})
        for attempt in range(1, MAX_ATTEMPTS + 1):
            crash(run.id, attempt)
            if attempt < MAX_ATTEMPTS:
                wait_until("the retry", lambda: state_name(run.id) == "AwaitingRetry")
        later = c.create_flow_run_from_deployment(deployment, parameters={"experiment": "once"})
        crash(later.id, 1)
        wait_until("the later run's retry", lambda: state_name(later.id) == "AwaitingRetry")
        last = c.read_flow_run(run.id)
        retries = [s for s in c.read_flow_run_states(run.id) if s.name == "AwaitingRetry"]
    assert last.state.is_crashed() and last.run_count == MAX_ATTEMPTS, last.state
    assert last.state.message == f"attempt {MAX_ATTEMPTS} died"
    assert len(retries) == MAX_ATTEMPTS - 1


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


def latest_run(flow_name: str):
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with client() as c:
        return c.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=1,
        )[0]


def experiment(toy: Path, name: str) -> dict:
    exps = dvc_json(toy, "exp", "show")
    (found,) = [
        e
        for base in exps
        for e in (base.get("experiments") or [])
        for e in e["revs"]
        if e["name"] == name
    ]
    return found


@pytest.mark.slow
@pytest.mark.usefixtures("fresh")
def test_demo_deployment_end_to_end(
    project, prefect_server: dict, controls: dict, tmp_path: Path
) -> None:
    """`prefect deployment run pipeline/demo --watch` with an override: it runs in the run
    workspace, the checkout is untouched, and the run is an experiment DVC can reproduce."""
    from flows.pipeline import pipeline

    toy = project.path
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
    assert sorted(ran) == [
        "download",
        "download",
        "evaluate",
        "package",
        "stats",
        "tokenizer",
        "train",
    ]
    untouched(project)
    # lineage: the score, the inputs it came from and the recipe
    table = {row["field"]: row["value"] for row in artifact(run, "lineage")}
    head = sh("git", "rev-parse", "HEAD", cwd=toy).strip()
    assert table["bleu"] == "2.0" and table["chrf"] == "50.0"
    assert table["code_revision"] == head and len(table["code_hash"]) == 64
    assert table["preset"] == "demo" and table["overrides"] == "['train.max_steps=20']"
    assert table["data_hash"].startswith("data/raw=") and ".dir" in table["data_hash"]
    assert "step_00000020.pt" in table["checkpoints_averaged"]
    assert len(table["params_sha256"]) == 64 and table["test_sha256"] != "None"
    assert "missing" not in table
    assert "data/live/plots/metrics/train/loss.tsv | 20 |" in artifact(run, "training-curves")
    # DVC's view: the workspace is up to date, and the checkout lists the experiment
    ws = toy / WORKSPACE
    assert dvc_json(ws, "status") == {}
    exp = experiment(toy, table["experiment"])
    assert exp["data"]["params"]["params.yaml"]["data"]["train"]["max_steps"] == 20
    assert exp["data"]["metrics"]["data/metrics/evaluate.json"]["data"]["bleu"] == 2.0
    # ... and plain `dvc repro` of the experiment's commit leaves the very same outputs
    clone = tmp_path / "clone"
    sh("git", "clone", "-q", str(toy), str(clone), cwd=tmp_path)
    sh("git", "fetch", "-q", "origin", "+refs/exps/*:refs/exps/*", cwd=clone)
    sh("git", "checkout", "-q", table["experiment_commit"], cwd=clone)
    sh(sys.executable, "-m", "dvc", "repro", cwd=clone)
    assert locked_outs((clone / "dvc.lock").read_text()) == locked_outs(
        (ws / "dvc.lock").read_text()
    )
    # the same recipe again skips every stage: DVC decides what is stale
    before = controls["TOY_RUNLOG"].read_text()
    result = pipeline(preset="demo", overrides=["train.max_steps=20"], project=str(toy))
    assert set(result["stages"].values()) == {"skipped"}
    assert controls["TOY_RUNLOG"].read_text() == before
    untouched(project)


@pytest.mark.slow
@pytest.mark.usefixtures("fresh")
def test_one_off_run_then_scheduled_retrain(project, prefect_server: dict, controls: dict) -> None:
    """A one-off run with an override does not leak into the scheduled retrain, which trains
    its own recipe (serve's: the demo preset), waits for its concurrency slot, and becomes the
    first champion; a second retrain with nothing changed trains nothing."""
    from prefect.states import Scheduled

    toy = project.path
    hold, started, runlog = controls["TOY_HOLD"], controls["TOY_STARTED"], controls["TOY_RUNLOG"]
    r = flows_run(prefect_server, "pipeline/demo", "-p", 'overrides=["train.max_steps=100"]')
    assert r.returncode == 0 and flow_run(run_id(r.stdout)).state.is_completed(), r.stdout
    assert "stage train: Completed" in r.stdout and "ended Completed" in r.stdout
    untouched(project)
    started.unlink(missing_ok=True)
    hold.touch()  # the first retrain's train stage waits until the test removes this file
    # the cron schedule made a run for next Monday; start it now instead
    first = wait_until(
        "a scheduled retrain run", lambda: deployment_runs("retrain/retrain", "SCHEDULED")
    )[0]
    assert first.auto_scheduled and first.parameters == {"preset": "demo", "overrides": []}
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
    a, b = finished(str(first.id)), finished(second)
    assert a.state.is_completed() and b.state.is_completed(), (a.state, b.state)
    assert b.start_time >= a.end_time  # never both at once
    # the retrain trained the demo recipe (600 steps: BLEU 60 in the toy), not the override's
    decision = artifact(str(first.id), "retrain-decision")
    assert "promoted as v1.0.0" in decision and "no champion yet" in decision
    assert "| candidate | retrain-" in decision  # the experiment, by name (the retrain flow's)
    assert tags(toy) == ["transformer#prod#1", "transformer@v1.0.0"]
    from flows import registry

    champion = registry.champion(toy)
    assert champion["bleu"] == 60.0 and champion["version"] == "v1.0.0"
    assert champion["preset"] == "demo" and champion["overrides"] == []
    assert "nothing retrained" in artifact(second, "retrain-decision")
    assert "stage train: ran" in logs(str(first.id))  # retrain's log shows the stages it ran
    assert "Logging error" not in project.serve.log_path.read_text()
    assert runlog.read_text().split().count("train") >= 2
    untouched(project)


@pytest.mark.slow
@pytest.mark.usefixtures("champion")
def test_retrain_considers_code_and_recipe_changes_and_runs_queue(
    project, prefect_server: dict, controls: dict
) -> None:
    """Not only new data: a commit that changes the code, or another recipe, is a candidate
    too. Two runs started at once take turns in the one workspace, each with its own recipe."""
    from flows.retrain import retrain

    toy = project.path
    with open(toy / "toy.py", "a") as f:
        f.write("# a change of the code the pipeline runs\n")
    sh("git", "commit", "-qam", "a code change", cwd=toy)
    out = retrain(preset="demo", project=str(toy))
    assert out["retrained"] and out["reason"].startswith("code_hash changed;"), out["reason"]
    assert not out["promoted"] and "does not beat champion 60.00" in out["reason"]
    out = retrain(preset="demo", overrides=["train.max_steps=500"], project=str(toy))
    # against the champion, made before the code change: both differ
    assert out["reason"].startswith("code_hash, params_sha256 changed;"), out["reason"]
    assert not out["promoted"] and out["candidate"]["overrides"] == ["train.max_steps=500"]
    runs = [
        run_id(
            deployment_run(
                prefect_server,
                "pipeline/demo",
                "-p",
                f'overrides=["train.max_steps={n}"]',
                watch=False,
            ).stdout
        )
        for n in (40, 50)
    ]
    for each, n in zip(runs, (40, 50)):
        assert finished(each).state.is_completed()
        table = {row["field"]: row["value"] for row in artifact(each, "lineage")}
        assert table["overrides"] == f"['train.max_steps={n}']" and table["bleu"] == str(n / 10)
    assert any("another flow run holds the workspace; waiting" in logs(r) for r in runs)
    untouched(project)


@pytest.mark.slow
def test_a_failed_run_names_its_cause_and_changes_nothing(
    project, prefect_server: dict, controls: dict
) -> None:
    """`python -m flows.run ... --wait` exits 1 and prints the cause and the stage (a bad
    override's: test_flows_outcomes)."""
    controls["TOY_FAIL_TRAIN"].touch()
    try:
        r = flows_run(prefect_server, "pipeline/demo", "-p", 'overrides=["train.max_steps=70"]')
    finally:
        controls["TOY_FAIL_TRAIN"].unlink()
    state = flow_run(run_id(r.stdout)).state
    assert state.is_failed(), state
    cause = "stage train failed: error: data/shards/train.bin: not a shard (simulated corruption)"
    assert cause in state.message
    last = r.stdout.splitlines()[-1]
    assert r.returncode == 1 and "ended Failed" in last and "in stage train: " in last, r.stdout
    assert cause in last
    untouched(project)


@pytest.mark.slow
def test_a_stages_out_of_memory_error_is_named_as_such(
    project, prefect_server: dict, controls: dict
) -> None:
    """The stage's failure record (transformer/core/failure.py), not DVC's "failed to
    reproduce" wrapper nor a guessed line, names a dotted exception in the run's state."""
    controls["TOY_OOM_TRAIN"].touch()
    try:
        r = flows_run(prefect_server, "pipeline/demo", "-p", 'overrides=["train.max_steps=80"]')
    finally:
        controls["TOY_OOM_TRAIN"].unlink()
    state = flow_run(run_id(r.stdout)).state
    assert state.is_failed(), state
    cause = (
        "stage train failed: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "2.00 GiB (simulated) (stage train)"
    )
    assert cause in state.message, state.message
    assert "failed to reproduce" not in state.message.splitlines()[0]
    assert r.returncode == 1 and cause in r.stdout.splitlines()[-1], r.stdout
    untouched(project)


@pytest.mark.slow
@pytest.mark.usefixtures("champion")
def test_manual_experiments_go_through_the_same_gate(project, prefect_server: dict) -> None:
    """`dvc exp run` by hand, then `python -m flows.promote NAME`: a better one is promoted, a
    worse one refused with the reason in the promotion-decision artifact."""
    toy, env = project.path, project.env
    dvc = (sys.executable, "-m", "dvc")
    cli = {**prefect_server, **env, "PYTHONPATH": str(toy)}
    for name, steps in (("by-hand-better", 900), ("by-hand-worse", 300)):
        sh(
            *dvc,
            "exp",
            "run",
            "--temp",
            "-n",
            name,
            "-S",
            f"train.max_steps={steps}",
            cwd=toy,
            env=cli,
        )
    out = sh(sys.executable, "-m", "flows.promote", "by-hand-better", cwd=toy, env=cli)
    assert "promoted as v2.0.0: candidate BLEU 90.00 beats champion 60.00" in out
    worse = promote_cli("by-hand-worse", toy, cli)
    assert worse.returncode == 3, worse.stdout + worse.stderr  # refused: a script can tell
    assert "not promoted: candidate BLEU 30.00 does not beat champion 90.00" in worse.stdout
    assert tags(toy)[-1] == "transformer@v2.0.0" and "transformer#prod#2" in tags(toy)
    from flows import registry

    assert registry.champion(toy)["bleu"] == 90.0
    refused = latest_run("promote")
    decision = artifact(str(refused.id), "promotion-decision")
    assert "champion kept" in decision and "does not beat champion 90.00" in decision
    assert "| candidate | by-hand-worse |" in decision  # the experiments, by name
    assert "| champion before | by-hand-better |" in decision
    # git alone tells the history: one annotated tag per decision, refusals included
    assert "refused: candidate BLEU 30.00 does not beat champion 90.00" in sh(
        "git", "tag", "-n1", "--list", "decision/*", cwd=toy
    )


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
    record = lineage(Snapshot(tmp_path), dag, "HEAD")
    assert record["data_hash"] == "data/raw=a1.dir"
    assert record["shards_hash"] == "data/shards=b2.dir"  # the metrics file is not an output
    assert lineage(Snapshot(tmp_path), {"download": dag["download"]}, "HEAD")["shards_hash"] is None


def test_lineage_carries_the_origin_the_train_stage_recorded(tmp_path):
    """A run that went on from another run's checkpoints: the train stage's metrics say from
    which (test_flows_outcomes runs the real stage), and so does the lineage record the
    pipeline's `lineage` artifact lists field by field."""
    metric = "data/live/metrics.json"
    dag = {"train": Stage("train", (), ("data/checkpoints", metric), (metric,), (), (metric,))}
    origin = {"from": "pipeline-a", "step": 4, "seconds": 12.5}
    (tmp_path / "data/live").mkdir(parents=True)
    (tmp_path / metric).write_text(json.dumps({"step": 8, "origin": origin}))
    assert lineage(Snapshot(tmp_path), dag, "HEAD")["origin"] == origin
    (tmp_path / metric).write_text(json.dumps({"step": 8}))  # a fresh run
    assert lineage(Snapshot(tmp_path), dag, "HEAD")["origin"] is None


def test_the_next_decision_publishes_what_a_down_remote_missed(
    toy: Path, prefect_server: dict, tmp_path: Path
) -> None:
    """The remote is unreachable when a candidate wins the gate: no version, no production tag,
    the decision says why; the next decision publishes it and promotes it, then any clone
    fetches it."""
    env = {**prefect_server, "TOY_CORPUS": str(toy.parent / "corpus"), "PYTHONPATH": str(toy)}
    (tmp_path / "down").write_text("a file where the remote's folder should be\n")
    sh(*DVC, "remote", "add", "-d", "store", str(tmp_path / "down" / "remote"), cwd=toy)
    sh("git", "commit", "-qm", "a DVC remote", ".dvc/config", cwd=toy)
    sh(*DVC, "exp", "run", "-n", "while-down", "-S", "train.max_steps=40", cwd=toy, env=env)

    first = promote_cli("while-down", toy, env)
    assert first.returncode == 3, first.stdout + first.stderr
    assert "won the gate (no champion yet), but its package is not on the DVC remote" in (
        first.stdout
    )
    assert not sh("git", "tag", "--list", "*@*", "*#*", cwd=toy)  # no version, no stage
    sh(*DVC, "remote", "modify", "store", "url", str(tmp_path / "remote"), cwd=toy)
    sh("git", "commit", "-qm", "the remote's new home", ".dvc/config", cwd=toy)
    again = promote_cli("while-down", toy, env)
    assert again.returncode == 0 and "promoted as v1.0.0" in again.stdout, again.stderr
    assert "v1.0.0: on the remote already" in sh(
        sys.executable, "-m", "flows.registry", "publish", cwd=toy, env=env
    )
    fresh = fetch_champion(toy, tmp_path)
    assert (fresh / "champion/model.pt").read_text().startswith("40 ")
