"""When a training run logs, validates, saves and stops (train.*_every_*, max_steps, the budget).

Step counts need no word between ranks. The wall-clock decisions (a checkpoint every N minutes,
the time budget) are rank 0's, so that every rank acts on the same: they travel once per update,
packed with the update's target-token count into one small collective on CPU tensors (a gloo
group beside NCCL), which neither waits for the GPU nor makes it wait.
"""

from __future__ import annotations

import sys
import time

import torch

from transformer.core import dist
from transformer.core.sections.train import TrainConfig


class Clock:
    """The run's schedule of points: `tick` each update, then ask `should_*` of it."""

    def __init__(self, cfg: TrainConfig, step: int, seconds: float, finished: bool):
        """From `step` after `seconds` of training; `finished`: that step's checkpoint is final."""
        self.cfg, self.base, self.started = cfg, seconds, time.monotonic()
        self.saved_at = self.started
        self.max_steps = cfg.max_steps if cfg.max_steps > 0 else sys.maxsize
        if finished and 0 < 60 * cfg.time_budget_minutes <= seconds:
            self.max_steps = step  # resumed at this budget's last checkpoint: nothing left to train
        # (a periodic checkpoint past the budget: the run went on to one more step, the final one;
        # so does its resume, whose first step finds the budget spent)
        self.stop = step >= self.max_steps  # the last update is done (or, after a tick, this one)
        self.save_due = False  # rank 0's save_every_minutes has come round
        self.ticked = seconds  # seconds trained at the last tick

    def seconds(self) -> float:
        """Seconds of training, across resumes."""
        return self.base + time.monotonic() - self.started

    def tick(self, step: int, n_tokens: int) -> float:
        """Update `step` begins with `n_tokens` target tokens on this rank: the update's tokens on
        all ranks (the loss is normalised per token of the whole update), and rank 0's decisions
        to save and to stop after it, shared."""
        cfg, self.ticked, main = self.cfg, self.seconds(), dist.is_main()
        save = main and 0 < 60 * cfg.save_every_minutes <= time.monotonic() - self.saved_at
        spent = main and 0 < 60 * cfg.time_budget_minutes <= self.ticked
        packed = torch.tensor([n_tokens, save, spent], dtype=torch.float64)
        total, save, spent = dist.all_reduce_host(packed).tolist()
        self.save_due = save > 0
        self.stop = step >= self.max_steps or spent > 0
        return total

    def progress(self, steps: int) -> float:
        """How far through the run after `steps` updates: the larger of steps / max_steps and
        seconds (at the last tick) / the budget."""
        p = steps / self.cfg.max_steps if self.cfg.max_steps > 0 else 0.0
        if self.cfg.time_budget_minutes > 0:
            p = max(p, self.ticked / (60.0 * self.cfg.time_budget_minutes))
        return p

    def should_log(self, step: int) -> bool:
        return step % max(self.cfg.log_every_steps, 1) == 0 or self.stop

    def should_validate(self, step: int) -> bool:
        every = self.cfg.valid_every_steps
        return (every > 0 and step % every == 0) or self.stop

    def should_save(self, step: int) -> bool:
        every = self.cfg.save_every_steps
        return self.stop or self.save_due or (every > 0 and step % every == 0)

    def saved(self) -> None:
        self.saved_at = time.monotonic()
