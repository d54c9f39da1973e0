"""Through the flows on a real Prefect server: a train stage that gets the preemption notice
(SIGTERM: it saves its update in progress, exit 75) is resumed in its task run, whose state says
preempted, not failed. The real launcher and trainer on a tiny corpus, in a git + DVC project."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers.train import ROOT, write_params
from prefect import flow
from prefect_fixtures import client, git_init, run_logs

from flows.dag import read_dag
from flows.pipeline import run_stages
from transformer.model import checkpoint

STEPS, EVERY = 20, 5


def train_project(path: Path, corpus: Path) -> Path:
    """A git + DVC project whose one stage is the real train command on the tiny corpus."""
    path.mkdir()
    write_params(
        path / "params.yaml",
        max_steps=STEPS,
        save_every_steps=EVERY,
        keep_last=0,
        valid_every_steps=0,
        log_every_steps=EVERY,
    )
    cmd = (
        f"{sys.executable} -m transformer.launch --standalone --nproc_per_node=1 "
        f"-m transformer.train {corpus / 'shards'} {corpus / 'tok'} data/checkpoints "
        "--resume --no-progress"
    )
    stage = {"cmd": cmd, "outs": [{"data/checkpoints": {"persist": True, "cache": False}}]}
    (path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": stage}}))
    (path / ".gitignore").write_text("/data/\n")
    git_init(path)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", "commit", "-qm", "train only"], cwd=path, check=True)
    return path


@flow(name="train-stage")
def train_stage(project: str) -> dict[str, str]:
    return run_stages(Path(project), read_dag(Path(project)))


def launcher() -> int | None:
    """This test's `python -m transformer.launch` process (a descendant of this one), if any."""
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            # every thread's children: Prefect runs a task, and so its `dvc`, in a worker thread
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        if b"transformer.launch" in argv:
            return pid
    return None


def notice_once_saved(ckpt: Path, sent: list[int], done: threading.Event) -> None:
    """SIGTERM to the stage's launcher once its first checkpoint is written (unless the flow
    has ended: then `sent` stays empty)."""
    while not done.is_set():
        if ckpt.exists() and (pid := launcher()) is not None:
            os.kill(pid, signal.SIGTERM)
            sent.append(pid)
            return
        time.sleep(0.01)


@pytest.mark.slow  # a Prefect server; the train stage, preempted and resumed
def test_a_preempted_train_stage_is_resumed_and_its_state_says_preempted(
    prefect_server, corpus, tmp_path, monkeypatch
):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the stage's `python -m transformer.*`
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    project = train_project(tmp_path / "project", corpus)
    ckpts = project / "data" / "checkpoints"
    sent: list[int] = []
    done = threading.Event()
    watch = threading.Thread(
        target=notice_once_saved, args=(checkpoint.step_path(ckpts, EVERY), sent, done)
    )
    watch.start()
    try:
        state = train_stage(str(project), return_state=True)
    finally:
        done.set()
        watch.join()
    assert sent and state.is_completed(), state.message
    run = str(state.state_details.flow_run_id)
    with client() as c:
        (task,) = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run])))
        states = c.read_task_run_states(task.id)
    retried = [s for s in states if s.name == "Retrying"]
    assert len(retried) == 1 and "stage train preempted (exit 75" in retried[0].message, states
    assert not any(s.is_failed() for s in states) and states[-1].is_completed()
    logs = "\n".join(run_logs(run))
    resumed = [ln for ln in logs.splitlines() if ln.startswith("resuming from")]
    assert len(resumed) == 1, logs
    step = int(resumed[0].rsplit("(step ", 1)[1].rstrip(")"))
    assert EVERY < step < STEPS  # the update in progress when the notice came, saved
    assert checkpoint.load(checkpoint.step_path(ckpts, STEPS))["final"]
