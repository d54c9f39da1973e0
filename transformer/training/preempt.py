"""The preemption notice: SIGTERM or SIGUSR1 finishes the update in progress, saves, exits 75.

A cloud or a scheduler that takes the machine back says so first (Slurm's `--signal`,
Kubernetes' SIGTERM before terminationGracePeriodSeconds, a spot instance's notice). The signal
only raises a flag; after each update every rank reads every rank's flag (`Notice.agreed`: one
all-reduce of one number on the CPU; alone, no collective), so that all of them stop after the
same update, write its checkpoint and exit with PREEMPTED: `--resume` goes on from it, bit for
bit. A second signal while that checkpoint is written changes nothing (and a SIGKILL leaves the
one before: checkpoints are written to a temporary name and renamed).

Under `python -m transformer.launch` (torchrun) a rank that got the notice itself passes it on to
the launcher, which stops every rank the same way instead of restarting the group (launch.py).
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from transformer.core import dist
from transformer.core.failure import PREEMPTED

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # the notice; SIGINT stays Ctrl-C (exit 130)
LAUNCHER = "TRANSFORMER_LAUNCHER_PID"  # set by launch.py for its ranks: where to pass it on
PASS_ON = signal.SIGUSR2  # a rank's notice, to the launcher
T = TypeVar("T")

_received: list[int] = []  # the notice's signals, as they came
_training: list[bool] = [False]  # whether the loop has begun: a Notice asks after each update


def _say(text: str) -> None:
    """To stderr without print(): a handler may run inside a print of the loop's (reentrant)."""
    os.write(2, f"{text}\n".encode())


def _on_signal(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    _received.append(signum)
    if len(_received) > 1:
        _say(f"{name}: already stopping; the checkpoint is being written")
        return
    if _launcher_waits():
        os.kill(os.getppid(), PASS_ON)
    if not _training[0]:  # no update begun, nothing to save (a rank may wait on another here)
        _say(f"{name}: preemption notice before training began; exiting {PREEMPTED}")
        raise SystemExit(PREEMPTED)
    _say(f"{name}: preemption notice; finishing this update, saving it, exiting {PREEMPTED}")


def _launcher_waits() -> bool:
    """Whether this rank's launcher should hear of the notice: this process is its rank, and
    all its local ranks are alive (when one has died, the agent stops the rest with SIGTERM
    to restart the group: not a notice to pass on)."""
    parent = os.getppid()
    if os.environ.get(LAUNCHER) != str(parent):
        return False
    try:  # (each thread's children: the agent's thread that started them)
        tasks = Path(f"/proc/{parent}/task").iterdir()
        ranks = [c for t in tasks for c in (t / "children").read_text().split()]
    except OSError:  # not Linux: pass it on
        return True
    return len(ranks) >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def handled(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` with the notice's signals handled while it runs (the flag cleared first); the
    handlers it found are back after."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> T:
        _received.clear()
        old = {s: signal.signal(s, _on_signal) for s in SIGNALS}
        try:
            return fn(*args, **kwargs)
        finally:
            _training[0] = False
            for s, h in old.items():
                signal.signal(s, h)

    return wrapper


class Notice:
    """Whether to stop after this update: ask `agreed()` once per update, on every rank."""

    def __init__(self) -> None:
        self.stopped = False  # the ranks agreed to stop: the last update's checkpoint is saved
        _training[0] = True

    def agreed(self) -> bool:
        """Whether any rank has had the notice (a collective: every rank calls it)."""
        flag = torch.tensor([float(bool(_received))])
        self.stopped = dist.all_reduce_host(flag).item() > 0
        return self.stopped
