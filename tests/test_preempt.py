"""The preemption notice (SIGTERM / SIGUSR1: save the update in progress, exit 75) and a lost rank
(torchrun restarts the group, which resumes): real train processes, gloo ranks, fp32 on CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import forked
from helpers.train import ROOT, write_params

from transformer import launch
from transformer.model import checkpoint
from transformer.training import preempt

# a run's updates; its periodic checkpoints. Room for two notices, each a few updates late on
# a busy machine, before the last checkpoint
STEPS, EVERY = 40, 5


def start(corpus: Path, ckpt: Path, params: Path, nproc: int, *launch: str):
    """The stage's command: `python -m transformer.launch ... -m transformer.train` with `nproc`
    gloo ranks, or, with nproc 0, the lone train process (forked: helpers/forked.py)."""
    args = [str(corpus / "shards"), str(corpus / "tok"), str(ckpt), "--params", str(params)]
    args += ["--no-progress", "--resume"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if not nproc:
        return forked.start("transformer.train", *args, env=env, merged=True)
    launcher = ["-m", "transformer.launch", "--standalone", f"--nproc_per_node={nproc}", *launch]
    cmd = [sys.executable, *launcher, "-m", "transformer.train", *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def when_saved(proc, ckpt: Path, step: int) -> None:
    path = checkpoint.step_path(ckpt, step)
    while not path.exists() and proc.poll() is None:
        time.sleep(0.005)
    assert proc.poll() is None, "finished before the signal"


def ranks(launcher: subprocess.Popen) -> list[int]:
    """The launcher's rank processes (its children), rank 0 first."""
    pid = launcher.pid
    return sorted(
        int(c)
        for t in Path(f"/proc/{pid}/task").iterdir()
        for c in (t / "children").read_text().split()
    )


def assert_same_weights(a: Path, b: Path) -> None:
    x, y = checkpoint.load(a), checkpoint.load(b)
    for k, v in x["model"].items():
        assert torch.equal(v, y["model"][k]), k  # bit for bit
    for sx, sy in zip(x["optimizer"]["state"].values(), y["optimizer"]["state"].values()):
        assert torch.equal(sx["exp_avg_sq"], sy["exp_avg_sq"])
    assert x["data"] == y["data"]


def params(path: Path, nproc: int) -> Path:
    return write_params(
        path,
        max_steps=STEPS,
        save_every_steps=EVERY,
        keep_last=0,
        valid_every_steps=0,
        log_every_steps=EVERY,
        nproc=max(nproc, 1),
    )


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory):
    """nproc -> the last checkpoint of a run never stopped (made once per module)."""
    done: dict[int, Path] = {}

    def last(nproc: int) -> Path:
        if nproc not in done:
            d = tmp_path_factory.mktemp(f"uninterrupted-{nproc}")
            code, out = finish(start(corpus, d / "ck", params(d / "params.yaml", nproc), nproc))
            assert code == 0, out
            done[nproc] = checkpoint.step_path(d / "ck", STEPS)
        return done[nproc]

    return last


def test_the_notice_raises_the_flag_and_the_old_handlers_come_back(capfd):
    before = signal.getsignal(signal.SIGUSR1)
    notice = preempt.Notice()

    def body():
        assert not notice.agreed()
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: no harm, still stopping
        return notice.agreed()

    assert preempt.handled(body)() and notice.stopped
    assert signal.getsignal(signal.SIGUSR1) is before
    err = capfd.readouterr().err
    assert "SIGUSR1: preemption notice" in err and "SIGTERM: already stopping" in err


@pytest.mark.parametrize(
    ("argv", "alone"),
    [
        (["--standalone", "--nproc_per_node=1"], True),
        (["--standalone", "--nproc-per-node", "1", "--max-restarts=0"], True),
        (["--nnodes=1", "--nproc_per_node=1"], True),
        (["--standalone", "--nproc_per_node=2"], False),
        (["--standalone", "--nproc_per_node=1", "--max-restarts=1"], False),
        (["--nnodes=2", "--nproc_per_node=1"], False),
    ],
)
def test_one_process_never_restarted_runs_in_the_launcher_without_torchruns_agent(argv, alone):
    """Nothing for an agent to do: the stage's module runs in the launcher's process
    (test_flows_preempt: such a train stage, SIGTERM'd through DVC, exits 75 and resumes)."""
    assert launch.alone([*argv, "-m", "transformer.train", "shards", "--resume"]) is alone


@pytest.mark.slow  # train processes: preempted runs and their resumes (and, once, one not stopped)
@pytest.mark.parametrize(
    ("nproc", "notices"),
    [
        (0, [("process", signal.SIGTERM)]),
        (2, [("launcher", signal.SIGTERM), ("rank 1", signal.SIGUSR1)]),
    ],
    ids=["1 process SIGTERM", "2 ranks SIGTERM to torchrun, resumed, then SIGUSR1 to rank 1"],
)
def test_a_notice_saves_the_update_in_progress_exits_75_and_resumes_bit_exact(
    corpus, tmp_path, uninterrupted, nproc, notices
):
    """Each notice cuts a run (the second one the first one's resume) after a periodic
    checkpoint; the last resume ends bit for bit where a run never stopped ends."""
    p = params(tmp_path / "params.yaml", nproc)
    after, resumed_from = EVERY, ""  # the periodic checkpoint a notice waits for
    for to, sig in notices:
        # --max-restarts: a notice is no failure to restart from
        proc = start(corpus, tmp_path / "cut", p, nproc, "--max-restarts=1")
        when_saved(proc, tmp_path / "cut", after)
        target = ranks(proc)[1] if to == "rank 1" else proc.pid
        os.kill(target, sig)
        os.kill(target, sig)  # a second notice while the first is acted on (or the two as one)
        code, out = finish(proc)
        assert code == preempt.PREEMPTED, out
        assert resumed_from in out, out
        saved = checkpoint.list_checkpoints(tmp_path / "cut")
        cut = checkpoint.load(saved[-1])
        # the update in progress when the notice came, not the periodic checkpoint before it
        assert after < cut["step"] < STEPS and not cut["final"], [p.name for p in saved]
        assert f"preempted at step {cut['step']}: --resume continues from it" in out
        assert "preemption notice" in out and "Traceback" not in out
        assert not list((tmp_path / "cut").glob(".*.tmp"))  # nothing half-written
        resumed_from = f"resuming from {saved[-1]} (step {cut['step']})"
        after = (cut["step"] // EVERY + 1) * EVERY  # the resumed run's next periodic checkpoint
    code, resumed = finish(start(corpus, tmp_path / "cut", p, nproc))
    assert code == 0, resumed
    assert resumed_from in resumed
    assert_same_weights(uninterrupted(nproc), checkpoint.step_path(tmp_path / "cut", STEPS))


@pytest.mark.slow  # torchrun with two gloo ranks, one SIGKILLed (and, once, a run not stopped)
def test_a_killed_rank_restarts_the_group_which_resumes_and_ends_bit_exact(
    corpus, tmp_path, uninterrupted
):
    p = params(tmp_path / "params.yaml", 2)
    proc = start(corpus, tmp_path / "lost", p, 2, "--max-restarts=1")
    when_saved(proc, tmp_path / "lost", EVERY)
    os.kill(ranks(proc)[1], signal.SIGKILL)
    code, out = finish(proc)
    assert code == 0, out
    assert "exitcode: -9" in out  # the agent saw the lost rank, and restarted the group
    resumed = [line for line in out.splitlines() if line.startswith("resuming from")]
    assert len(resumed) == 1 and "(step " in resumed[0], out
    assert_same_weights(uninterrupted(2), checkpoint.step_path(tmp_path / "lost", STEPS))


def test_a_failed_replay_restarts_the_run_from_its_checkpoint_eagerly_with_the_same_weights(
    corpus, tmp_path
):
    """A captured update (on the CPU through graphs.py's seam) whose replay raises: the train
    stage exits 76 saving nothing, the launcher starts it afresh with --resume from its newest
    checkpoint, that shape eager; a second failed replay, every shape eager. The run completes
    with the weights of an uninterrupted eager run."""
    from transformer.training import graphs

    params = write_params(tmp_path / "params.yaml", max_steps=16, static_shapes="on")
    args = [str(corpus / "shards"), str(corpus / "tok")]
    rest = ["--params", str(params), "--no-progress", "--resume"]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
    }
    launcher = [sys.executable, "-m", "transformer.launch", "--standalone", "--nproc_per_node=1"]
    cmd = [*launcher, "-m", "helpers.captured_train", *args, str(tmp_path / "captured"), *rest]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert out.count("the replay of batch shape") == 2 and "illegal memory access" in out
    assert f"exiting {graphs.REPLAY_FAILED}" in out and "train.graphs: off" in out
    assert "restarting after the failed replay (1 of at most 2)" in out
    assert "run eagerly, as their replay failed before" in out  # the first restart: one shape
    assert "restarting after the failed replay (2 of at most 2)" in out
    assert "eager update, as replays failed twice" in out  # the second: every shape
    assert "resuming from" in out and "done: step 16" in out
    eager = forked.start("transformer.train", *args, str(tmp_path / "eager"), *rest, merged=True)
    code, text = finish(eager)
    assert code == 0, text
    a = checkpoint.load(checkpoint.step_path(tmp_path / "captured", 16))["model"]
    b = checkpoint.load(checkpoint.step_path(tmp_path / "eager", 16))["model"]
    assert all(torch.equal(a[k], b[k]) for k in b)
