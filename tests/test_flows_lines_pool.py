"""The lines on a Prefect work pool, as a GPU machine runs them: on the toy project with two
lines and a real Prefect server, `prefect work-pool create NAME --type process`, `python -m
flows.deploy --pool NAME` and a `prefect worker start --pool NAME` process; each line's
`retrain/NAME` is on the pool, and one run of each, started at once with `python -m flows.run
retrain/NAME --wait`, ends Completed through the worker. Their train stages take turns on the
machine's cores (flows/cores.py): they never overlap, and the one that waited says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.lines import LINES, declare, python, tags
from prefect_fixtures import BIN, STARTUP_S, client, make_toy, sh, stop, wait_until

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


@pytest.mark.slow
def test_the_lines_run_on_a_process_work_pool_through_a_worker(
    prefect_server: dict, tmp_path: Path
) -> None:
    toy = make_toy(tmp_path / "toy")
    declare(toy, LINES)
    corpus = str(toy.parent / "corpus")
    hold = tmp_path / "hold"
    hold.touch()
    env = {
        **prefect_server,
        "TOY_CORPUS": corpus,
        "PYTHONPATH": str(toy),
        "PREFECT_WORKER_QUERY_SECONDS": "1",  # the worker asks for runs every second
        "TOY_SPANS": str(tmp_path / "spans"),  # each train stage's start and end
        "TOY_HOLD": str(hold),
    }
    sh(str(BIN / "prefect"), "work-pool", "create", POOL, "--type", "process", cwd=toy, env=env)
    r = python(
        ["-m", "flows.deploy", "--pool", POOL, "--local-only", "--train-slots", "1"], toy, env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Looks like you're deploying" not in r.stdout + r.stderr  # a process pool is meant
    for name in ("en-de", "de-en"):
        assert f"deployment retrain/{name} on work pool {POOL}" in r.stdout, r.stdout
    with client() as c:
        for name, cron in (("en-de", None), ("de-en", "0 4 * * 1")):
            d = c.read_deployment_by_name(f"retrain/{name}")
            assert d.work_pool_name == POOL and d.parameters["line"] == name, d
            assert d.global_concurrency_limit.limit == 1  # one run at a time per line
            assert d.job_variables["working_dir"] == str(toy.resolve())
            assert d.job_variables["env"]["FLOWS_TRAIN_SLOTS"] == "1"  # each machine's turns
            assert [s.schedule.cron for s in d.schedules] == ([cron] if cron else [])

    proc, runs, outs = worker(toy, env), {}, {}
    try:
        for name in ("en-de", "de-en"):  # both lines at once, as a cron job or a script starts them
            runs[name] = subprocess.Popen(
                [sys.executable, "-m", "flows.run", f"retrain/{name}", "--wait"],
                cwd=toy,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            outs[name] = Printed(runs[name])
        # the first train stage holds the cores (TOY_HOLD) until the other waits for them
        waiter = wait_until("a train stage to wait for the cores", lambda: waiting(outs))
        wait_until(
            f"{waiter}'s flows.run to say it waits",
            lambda: "stage train: AwaitingConcurrencySlot: waiting for the cores" in outs[waiter],
        )
        hold.unlink()
        for p in runs.values():
            p.wait(timeout=1200)
    finally:
        for p in runs.values():
            p.kill()
        stop(proc, signal.SIGTERM)  # the worker's whole process group
    wait_until(
        "the worker's process group to end", lambda: not alive(proc.pid, group=True), timeout=60
    )
    worker_log = proc.log_path.read_text()
    outs = {name: str(out) for name, out in outs.items()}
    for name, out in outs.items():
        assert runs[name].returncode == 0, f"{name}:\n{out}\nworker:\n{worker_log}"
        run_id = out.split("UUID: ")[1].split()[0]
        with client() as c:
            run = c.read_flow_run(run_id)
        assert run.state.is_completed() and run.work_pool_name == POOL, run
        assert run_id in worker_log, worker_log  # the worker, no other process, ran it
        pid = int(str(run.infrastructure_pid).rsplit(":", 1)[-1])  # the run's own process
        wait_until(f"run {name}'s process {pid} to end", lambda p=pid: not alive(p), timeout=60)
        assert "promoted as v1.0.0" in out, out
    # the train stages never overlapped (each stage's own start and end), and only one waited
    spans = {}
    for line in (tmp_path / "spans").read_text().splitlines():
        where, what, at = line.rsplit(" ", 2)
        spans.setdefault(Path(where).name, {})[what] = float(at)
    assert set(spans) == {"en-de", "de-en"} and all(len(s) == 2 for s in spans.values()), spans
    first, second = sorted(spans.values(), key=lambda s: s["start"])
    assert first["end"] <= second["start"], spans
    assert spans[waiter] == second and "waiting for the cores" not in outs[other(waiter)]
    mine = tags(toy, "en-de*", "de-en*")
    assert set(mine) == {"en-de@v1.0.0", "en-de#prod#1", "de-en@v1.0.0", "de-en#prod#1"}
    for name in ("en-de", "de-en"):  # each line in its own workspace, the worker's too
        assert (toy / ".dvc/tmp/flows/lines" / name / "dvc.lock").exists()
