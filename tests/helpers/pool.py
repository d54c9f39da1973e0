"""A `process` work pool's worker and the runs it takes, for tests/test_flows_lines.py: the
worker started as a GPU machine's service starts it, what a `flows.run --wait` prints read as it
prints it, and which line's train stage waits for the machine's cores (flows/cores.py)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from prefect_fixtures import BIN, STARTUP_S, client

POOL = "gpu"


def worker(toy: Path, env: dict) -> subprocess.Popen:
    """`prefect worker start --pool POOL` in the toy, in a process group of its own, once it
    polls the pool."""
    log_path = toy.parent / "worker.log"
    log = open(log_path, "w")  # noqa: SIM115 (the worker writes to it until stopped)
    proc = subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", POOL],
        cwd=toy,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    proc.log_path = log_path  # type: ignore[attr-defined]
    deadline = time.monotonic() + STARTUP_S
    while "started!" not in log_path.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.2)
    return proc


def alive(pid: int, group: bool = False) -> bool:
    """Whether process `pid` (with `group`: any process of process group `pid`) is left."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Printed:
    """What a process prints, read as it prints it (a thread), so that a test can wait on it."""

    def __init__(self, proc: subprocess.Popen):
        self.text = ""
        self.thread = threading.Thread(target=self.read, args=(proc,), daemon=True)
        self.thread.start()

    def read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.text += line

    def __contains__(self, part: str) -> bool:
        return part in self.text

    def __str__(self) -> str:
        self.thread.join(timeout=60)
        return self.text


def other(name: str) -> str:
    return {"en-de": "de-en", "de-en": "en-de"}[name]


def waiting(outs: dict[str, Printed]) -> str | None:
    """The line whose train stage waits for the machine's cores (AwaitingConcurrencySlot)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    ids = {}
    for name, out in outs.items():
        if "UUID: " not in out:
            return None
        ids[out.text.split("UUID: ")[1].split()[0]] = name
    with client() as c:
        tasks = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(ids))))
    names = {
        ids[str(t.flow_run_id)]
        for t in tasks
        if t.name.startswith("train") and t.state and t.state.name == "AwaitingConcurrencySlot"
    }
    return names.pop() if len(names) == 1 else None
