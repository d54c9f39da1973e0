"""The train stage's progress in the Prefect UI: a progress artifact (a bar on the flow run's
page) of the fraction of max_steps, or of the time budget, done.

It reads what the stage writes anyway: dvclive's metrics.json (its `step` and `train.seconds`
after each log point), at most once every EVERY_S, from a thread beside the task's wait for
`dvc repro`. The stage and its log are as they were; the bar ends at 100% when the stage does.
A Prefect API error on the bar is a warning (flows/artifacts.py): the stage goes on, and the bar
takes the next read once the server answers again.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.artifacts import written
from flows.lineage import TRAIN  # the stage whose progress is shown
from flows.shell import logger, read_section

KEY = "train-progress"
# seconds between two reads (and updates): a bar, not a log; the tests' toy run takes seconds
EVERY_S = float(os.environ.get("FLOWS_PROGRESS_EVERY_S", "60"))


def limits(ws: Path) -> tuple[int, float]:
    """(max_steps, time budget in seconds) of the run in `ws`, 0 for none: train's, or
    retrain.continuation's where the run goes on from a parent (continued_train_config)."""
    train, retrain = read_section(ws, "train"), read_section(ws, "retrain")
    if retrain.get("mode") == "continue" and retrain.get("parent"):
        train = retrain["continuation"]
    return int(train.get("max_steps") or 0), 60.0 * float(train.get("time_budget_minutes") or 0)


def fraction(metrics: dict[str, Any], max_steps: int, budget_s: float) -> float:
    """How far the run is, from dvclive's summary: the larger of steps / max_steps and training
    seconds / the budget (the train stage's Clock.progress), at most 1."""
    done = metrics.get("step", 0) / max_steps if max_steps > 0 else 0.0
    seconds = (metrics.get("train") or {}).get("seconds")
    if budget_s > 0 and isinstance(seconds, int | float):
        done = max(done, seconds / budget_s)
    return min(max(done, 0.0), 1.0)


def read_metrics(path: Path, since: float) -> dict[str, Any] | None:
    """dvclive's summary if this run wrote it (a persisted one from an earlier run is not
    progress); None while it is not there, or caught mid-write."""
    try:
        if path.stat().st_mtime < since:
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def shown(ws: Path, stage: str) -> Iterator[None]:
    """Around the stage's `dvc repro`: for the train stage, a progress artifact updated from
    its metrics file (dvc.yaml's), set to 100% when the stage ends well."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    from flows.dag import read_dag

    metrics = read_dag(ws)[stage].metrics if stage == TRAIN else []
    if not metrics:
        yield
        return
    max_steps, budget_s = limits(ws)
    what = " and ".join(
        [f"{max_steps} steps"] * (max_steps > 0) + [f"{budget_s / 60:g} min"] * (budget_s > 0)
    )
    art = written(create_progress_artifact, 0.0, key=KEY, description=f"train stage: of {what}")
    if art is None:  # the server did not take it: the stage runs without a bar
        yield
        return
    stop, since, path = threading.Event(), time.time(), Path(ws) / metrics[0]
    # the task's logger: the thread has no run context of its own (nor the engine's client, so
    # an update fails at once while the server is down, instead of holding the stage's end)
    log = logger()

    def watch() -> None:
        last = 0.0
        while not stop.wait(EVERY_S):
            m = read_metrics(path, since)
            if m is None or (done := 100.0 * fraction(m, max_steps, budget_s)) <= last:
                continue
            if written(update_progress_artifact, art, done, log=log) is not None:
                last = done  # else the next read tries again: the bar resumes with the server

    thread = threading.Thread(target=watch, name="train-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    written(update_progress_artifact, art, 100.0)  # reached only when the stage ended well
