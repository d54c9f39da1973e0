"""The soak's faults of the train stage (benchmarks/faults/soak.py), and what each fault cost.

- sigterm: SIGTERM to the stage's torchrun agent (`python -m transformer.launch`) once it has
  logged a step drawn from the seed, after its first checkpoint: every rank saves its update in
  progress, the stage exits 75 and the flow resumes it in its task run (Retrying, "preempted");
- rankkill: SIGKILL of one of its 2 gloo ranks (drawn; "rank 0" is the one started first) at
  such a step: torchrun restarts the group (train.max_restarts), which resumes from the newest
  checkpoint;
- divergence: the cycle's retrain run gets `train.inject_divergence_at=STEP` (the update of that
  step turns NaN): the run rewinds to its last good checkpoint and goes on.

What was lost is counted in updates redone: for a fault that hit the running train stage, the
last step the stage had logged before it (the soak preset logs every step) minus the step it
resumed from ("resuming from ... (step M)" in the run's log, the first after the fault); for a
rewind, the steps its log line names as skipped (the divergence's step minus the checkpoint's),
which the train metrics sum as train/skipped_updates.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import time
from pathlib import Path

import psutil

TRAIN_FAULTS = ("sigterm", "divergence", "rankkill")
RESUMED = re.compile(r"^resuming from \S+ \(step (\d+)\)")
LOST = re.compile(r"exitcode\s*:\s*-9\b")
REWOUND = re.compile(r"rewound to \S+ \(step (\d+)\), the batches of step\(s\) (?:\d+-)?(\d+) ")


def agent(ws: Path) -> int | None:
    """The train stage's torchrun agent in the run workspace, if it runs."""
    root = str(ws.resolve())
    for p in psutil.process_iter(["cwd", "cmdline"]):
        if (p.info["cwd"] or "").startswith(root) and "transformer.launch" in (
            p.info["cmdline"] or ()
        ):
            return p.pid
    return None


def ranks(pid: int) -> list[int]:
    """The agent's rank processes (its children)."""
    with contextlib.suppress(psutil.Error):
        return sorted(c.pid for c in psutil.Process(pid).children())
    return []


def started(pid: int) -> float:
    """When process `pid` started (time.time()); inf if it is gone."""
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).create_time()
    return float("inf")


def reached(ws: Path) -> int | None:
    """The last step the running train stage has logged (dvclive's metrics.json, written since
    its agent started: a run workspace's checkout rewrites the last run's), if any."""
    path, pid = ws / "data/live/metrics.json", agent(ws)
    for _ in range(20):  # dvclive rewrites it at every log point: a read may meet it half-written
        with contextlib.suppress(OSError, ValueError, KeyError):
            if pid is None or path.stat().st_mtime < started(pid):
                return None
            return int(json.loads(path.read_text())["step"])
        time.sleep(0.05)
    return None


def hit(ws: Path) -> dict:
    """The moment of a fault, and the step the train stage had reached (None: not training)."""
    return {"at": time.time(), "reached": reached(ws)}


def wait_step(ws: Path, step: int, deadline: float) -> bool:
    """Wait until the train stage has logged step `step` while it still runs."""
    while time.monotonic() < deadline:
        if (reached(ws) or 0) >= step:
            return True
        time.sleep(0.05)
    return False


def strike(fault: str, at: int, ws: Path, rng: random.Random, log: list[str]) -> dict:
    """sigterm or rankkill once the train stage has logged step `at` (drawn by draw()): to its
    agent, or to a rank drawn from `rng`; the hit (hit())."""
    if not wait_step(ws, at, time.monotonic() + 600):
        log.append(f"{fault}: the train stage did not reach step {at} while it ran")
        return {}
    pid, rank = agent(ws), rng.randrange(2)
    targets = ranks(pid) if pid else []
    if fault == "rankkill" and len(targets) < 2:
        log.append(f"rankkill: the train stage's ranks not found ({targets})")
        return {}
    now = hit(ws)
    try:
        if fault == "sigterm":
            os.kill(pid, signal.SIGTERM)
            log.append(
                f"SIGTERM to the train stage's torchrun agent {pid} at step {now['reached']}"
            )
        else:
            os.kill(targets[rank], signal.SIGKILL)
            log.append(f"kill -9 of rank {rank} (pid {targets[rank]}) at step {now['reached']}")
    except (ProcessLookupError, TypeError):  # it finished meanwhile (pid None or gone)
        log.append(f"{fault}: the train stage had finished")
        return {}
    return now


def draw(rng: random.Random, steps: int, save_every: int) -> int:
    """The step a train fault strikes at: after the first checkpoint (a rewind or a restart
    needs one), before the last step (a signal must find the stage training)."""
    return rng.randint(save_every + 1, steps - 1)


def redone(lines: list[tuple[float, str]], fault_hit: dict) -> dict:
    """From the run's log lines (time.time(), message): the updates redone (None: not known),
    the steps resumed from after the fault, and the rewinds (step back to, step diverged)."""
    resumed = [
        int(m[1]) for t, text in lines if t >= fault_hit.get("at", 0) and (m := RESUMED.match(text))
    ]
    rewinds = [(int(m[1]), int(m[2])) for _, text in lines if (m := REWOUND.search(text))]
    lost = sum(last - back for back, last in rewinds) if rewinds else None
    if fault_hit.get("reached") is not None and resumed:
        lost = (lost or 0) + max(0, fault_hit["reached"] - resumed[0])
    return {"redone": lost, "resumed_from": resumed, "rewinds": rewinds}


def outcome(run: str, ws: Path, since: float, fault_hit: dict) -> dict:
    """What the cycle's train stage went through: its task states, the updates redone, the
    rewinds its metrics count."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter
    from prefect.client.schemas.filters import LogFilterFlowRunId as LogRun

    lines: list[tuple[float, str]] = []
    with get_client(sync_client=True) as c:
        while batch := c.read_logs(LogFilter(flow_run_id=LogRun(any_=[run])), offset=len(lines)):
            lines += [(log.timestamp.timestamp(), log.message) for log in batch]
        tasks = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run])))
        states = [
            (s.name, s.message or "")
            for t in tasks
            if t.name.rsplit("-", 1)[0] == "train"
            for s in c.read_task_run_states(t.id)
        ]
    metrics, counts = ws / "data/live/metrics.json", {}
    with contextlib.suppress(OSError, ValueError):
        if metrics.stat().st_mtime > since:
            counts = json.loads(metrics.read_text()).get("train", {})
    return {
        **redone(sorted(lines), fault_hit),
        "train_states": [n for n, _ in states],
        "preempted_retries": sum(n == "Retrying" and "preempted" in m for n, m in states),
        # torchrun's agent saw the rank die (and restarted the group: it resumed, `resumed_from`)
        "restarted": any(t >= fault_hit.get("at", 0) and LOST.search(text) for t, text in lines),
        "metrics_rewinds": counts.get("rewinds"),
        "metrics_skipped": counts.get("skipped_updates"),
    }


def checks(rows: list[dict]) -> dict[str, bool]:
    """Each drawn kind's expectation, named: the cycle Completed, and the fault did its part."""
    failed = {"Failed", "AwaitingRetry", "Crashed"}  # a failure, retried or not
    expect = {
        "sigterm": (
            "sigterm: the train stage retried as preempted (not Failed), the cycle Completed",
            lambda t: t["preempted_retries"] >= 1 and not set(t["train_states"]) & failed,
        ),
        "divergence": (
            "divergence: a rewind in the train metrics, as its log line says; the cycle Completed",
            lambda t: (
                (t["metrics_rewinds"] or 0) >= 1
                and t["metrics_skipped"] == sum(last - back for back, last in t["rewinds"])
            ),
        ),
        "rankkill": (
            "rankkill: torchrun restarted the group, which resumed; the cycle Completed",
            lambda t: t["restarted"] and t["resumed_from"] and not set(t["train_states"]) & failed,
        ),
    }
    return {
        name: all(r["state"] == "COMPLETED" and bool(ok(r["train"])) for r in got)
        for kind, (name, ok) in expect.items()
        if (got := [r for r in rows if r["fault"] == kind])
    }
