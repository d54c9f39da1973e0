"""Divergence without a person (train.max_rewinds): a run whose loss turns non-finite, spikes above
train.spike_factor x its running mean, or whose fp16 loss scale falls to its floor goes back to
its last good checkpoint, skips the batches since, trains the next train.rewind_updates updates at
train.rewind_lr_factor x the rate, and goes on; past max_rewinds it fails naming the steps.

The loss is seen only where the loop reads it back (log, validation and checkpoint points:
losses.py), so a divergence lies somewhere in the updates since the last read, and the update that
broke the weights may be earlier still (a checkpoint's weights show only in the loss of the
updates after it). So the rewind goes back to the newest checkpoint of finite weights written
before the last good read (or at it, if none is): weights, Adam, the loss scaler and the RNG as
resume.restore loads them; it skips every batch from there to the divergence, as PaLM did (§5.1),
the data position moved past the batches read; and it removes the checkpoints after it (of the
updates undone). Every rank reads the same all-reduced loss and rank 0 picks the checkpoint for
all, so the ranks rewind together. The rewinds and the running mean travel in every checkpoint
(key `rewind`): a killed run resumes with them, and the same run (checkpoints by steps) rewinds
the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from transformer.core import dist
from transformer.core.sections.train import TrainConfig
from transformer.model import checkpoint
from transformer.model.checkpoint import CheckpointError
from transformer.training.losses import LossSums, NonFiniteLoss
from transformer.training.resume import restore

MIN_LOSS_SCALE = 2.0**-14  # fp16: halved this far, every update overflows (fairseq stops at 1e-4)
MEAN_DECAY = 0.9  # the running mean of the loss per token, over read points


def diverged(
    loss: float, mean: float | None, spike_factor: float, scale: float | None
) -> tuple[str, str] | None:
    """(kind, why) a read of a finite loss per token `loss` diverged, or None: the fp16 loss
    `scale` at its floor, or a spike above spike_factor (0: off) x the running `mean` (None: none
    yet)."""
    if scale is not None and scale <= MIN_LOSS_SCALE:
        return "loss scale", f"fp16 loss scale {scale:g} at its floor {MIN_LOSS_SCALE:g}"
    if spike_factor and mean is not None and loss > spike_factor * mean:
        return "spike", (
            f"loss spike ({loss:.4g} per token, {loss / mean:.3g} x its running mean {mean:.4g})"
        )
    return None


def step_of(path: Path) -> int:
    return int(checkpoint.STEP_RE.search(path.name).group(1))


def steps_text(first: int, last: int) -> str:
    return f"{first}-{last}" if last > first else f"{last}"


class Rewinder:
    """The run's rewinds: `read` the loss at a read point (and rewind there if it diverged),
    `factor` of each update's rate, `inject` the test hook after each update."""

    def __init__(
        self, cfg: TrainConfig, ckpt_dir: Path, learner, sampler, state: dict | None = None
    ):
        self.cfg, self.ckpt_dir, self.learner, self.sampler = cfg, Path(ckpt_dir), learner, sampler
        state = state or {}
        # each: kind, the steps first-last whose loss diverged, the step rewound to (back)
        self.events: list[dict[str, Any]] = [dict(e) for e in state.get("events", [])]
        self.mean: float | None = state.get("mean")  # of the loss per token, at read points
        self.restored: dict[str, Any] = {}  # the checkpoint the last rewind went back to

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (key `rewind`), for a resume to go on with."""
        return {"events": [dict(e) for e in self.events], "mean": self.mean}

    def factor(self, step: int) -> float:
        """The rate's factor at `step`: rewind_lr_factor for rewind_updates updates after each
        rewind, else 1."""
        after = self.cfg.rewind_updates
        low = any(e["back"] < step <= e["back"] + after for e in self.events)
        return self.cfg.rewind_lr_factor if low else 1.0

    def inject(self, step: int) -> None:
        """train.inject_divergence_at (a test hook): that step's update leaves NaN weights and a
        NaN loss, as a diverged one does; the first time only (a rewound run's redo of the step
        trains). Done outside the update, in place: the captured update is the same with it."""
        at = self.cfg.inject_divergence_at
        if step != at or any(e["back"] < at <= e["last"] for e in self.events):
            return
        with torch.no_grad():
            for p in self.learner.model.parameters():
                p.fill_(float("nan"))
            self.learner.sums.fill_(float("nan"))

    def metrics(self) -> dict[str, int]:
        """The log point's train/* counts of rewinds (none with rewinds off)."""
        if not self.cfg.max_rewinds:
            return {}
        return {
            "train/rewinds": len(self.events),
            "train/diverged_at": self.events[-1]["last"] if self.events else 0,
            "train/skipped_updates": sum(e["last"] - e["back"] for e in self.events),
        }

    def read(self, losses: LossSums, step: int, pos: dict[str, int]) -> int | None:
        """losses.read(step), and None if the updates since the last read went well; else the step
        rewound to (model, Adam, scaler, RNG restored, the sampler at `pos`: past the batches
        read; the loop restarts its loss sums and batch stream there). With max_rewinds 0 a
        non-finite loss stops the run, and nothing else is checked."""
        if not self.cfg.max_rewinds:
            losses.read(step)
            return None
        first, good = losses.read_at + 1, losses.read_at
        try:
            losses.read(step)
        except NonFiniteLoss:
            why = ("non-finite", f"non-finite loss ({losses.last})")
            return self.rewind(why, first, step, good, pos)
        scaler = self.learner.scaler
        scale = scaler.get_scale() if scaler.is_enabled() else None
        why = diverged(losses.last, self.mean, self.cfg.spike_factor, scale)
        if why is not None:
            return self.rewind(why, first, step, good, pos)
        m = self.mean
        self.mean = losses.last if m is None else MEAN_DECAY * m + (1 - MEAN_DECAY) * losses.last
        return None

    def rewind(
        self, kind_why: tuple[str, str], first: int, step: int, good: int, pos: dict[str, int]
    ) -> int:
        """Back to the last good checkpoint (at or before step `good`), past the batches up to
        `step`; NonFiniteLoss naming the steps when the rewinds are spent or none is there."""
        kind, why = kind_why
        steps = steps_text(first, step)
        if len(self.events) >= self.cfg.max_rewinds:
            done = ", ".join(
                f"{steps_text(e['first'], e['last'])} (back to {e['back']})" for e in self.events
            )
            raise NonFiniteLoss(
                f"{why} at step {steps}: train.max_rewinds ({self.cfg.max_rewinds}) spent on the "
                f"divergences at steps {done}; stopping before any checkpoint of it is written"
            )
        found = self.last_good(good)
        if found is None:
            raise NonFiniteLoss(
                f"{why} at step {steps}, and no checkpoint of finite weights at or before step "
                f"{good} to rewind to; stopping before any checkpoint of it is written"
            )
        ckpt, path = found
        learner = self.learner
        back, _ = restore(ckpt, path, learner, self.sampler)  # graphs recaptured (load_state)
        self.sampler.load_state_dict(pos)  # past the batches of steps back+1 .. step
        if dist.is_main():  # the abandoned updates' checkpoints: not to average nor to resume
            for p in checkpoint.list_checkpoints(self.ckpt_dir):
                if step_of(p) > back:
                    p.unlink(missing_ok=True)
        self.mean = (ckpt.get("rewind") or {}).get("mean")
        self.restored = ckpt  # for the loop's other state kept in checkpoints (selection, EMA)
        self.events.append({"kind": kind, "first": first, "last": step, "back": back})
        dist.print0(
            f"{why} at step {steps}: rewound to {path} (step {back}), the batches of step(s) "
            f"{steps_text(back + 1, step)} skipped (and their checkpoints removed), the rate x{self.cfg.rewind_lr_factor:g} for "
            f"{self.cfg.rewind_updates} updates (rewind {len(self.events)} of at most "
            f"{self.cfg.max_rewinds})"
        )
        return back

    def last_good(self, good: int) -> tuple[dict[str, Any], str] | None:
        """The newest checkpoint of finite weights that a good read has tested: written before
        step `good`, the last good read (a checkpoint's weights show only in the loss of the
        updates after it); failing that, the one at `good`. And its path (rank 0 picks; every rank
        gets it, from disk or broadcast if not shared)."""
        path, ckpt = None, None
        if dist.is_main():
            for p in reversed(checkpoint.list_checkpoints(self.ckpt_dir)):
                step = step_of(p)
                if step > good:
                    continue
                try:  # written after a bad update whose loss had not been read yet: passed over
                    loaded = checkpoint.load(p)
                    checkpoint.check_finite(loaded["model"], p)
                except CheckpointError as e:
                    dist.print0(f"warning: {e}; not rewinding to it")
                    continue
                path, ckpt = p, loaded
                if step < good:
                    break
        path = dist.broadcast_object(str(path) if path else None)
        if path is None:
            return None
        visible = all(dist.all_gather_object(Path(path).is_file()))
        if not dist.is_main():
            ckpt = checkpoint.load(Path(path)) if visible else None
        ckpt = ckpt if visible else dist.broadcast_object(ckpt)
        return ckpt, path
