"""The lines on a Prefect work pool, as a GPU machine runs them: on the toy project with two
lines and a real Prefect server, `prefect work-pool create NAME --type process`, `python -m
flows.deploy --pool NAME` and a `prefect worker start --pool NAME` process; each line's
`retrain/NAME` is on the pool, and one run of each, started at once with `python -m flows.run
retrain/NAME --wait`, ends Completed through the worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect_fixtures import BIN, STARTUP_S, client, make_toy, sh, stop, wait_until
from test_flows_lines import LINES, declare, python, tags

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


@pytest.mark.slow
def test_the_lines_run_on_a_process_work_pool_through_a_worker(
    prefect_server: dict, tmp_path: Path
) -> None:
    toy = make_toy(tmp_path / "toy")
    declare(toy, LINES)
    corpus = str(toy.parent / "corpus")
    env = {
        **prefect_server,
        "TOY_CORPUS": corpus,
        "PYTHONPATH": str(toy),
        "PREFECT_WORKER_QUERY_SECONDS": "1",  # the worker asks for runs every second
    }
    sh(str(BIN / "prefect"), "work-pool", "create", POOL, "--type", "process", cwd=toy, env=env)
    r = python(["-m", "flows.deploy", "--pool", POOL, "--local-only"], toy, env)
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
            assert [s.schedule.cron for s in d.schedules] == ([cron] if cron else [])

    proc, runs = worker(toy, env), {}
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
        outs = {name: p.communicate(timeout=1200)[0] for name, p in runs.items()}
    finally:
        for p in runs.values():
            p.kill()
        stop(proc, signal.SIGTERM)  # the worker's whole process group
    wait_until(
        "the worker's process group to end", lambda: not alive(proc.pid, group=True), timeout=60
    )
    worker_log = proc.log_path.read_text()
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
    mine = tags(toy, "en-de*", "de-en*")
    assert set(mine) == {"en-de@v1.0.0", "en-de#prod#1", "de-en@v1.0.0", "de-en#prod#1"}
    for name in ("en-de", "de-en"):  # each line in its own workspace, the worker's too
        assert (toy / ".dvc/tmp/flows/lines" / name / "dvc.lock").exists()
