"""The training loop's state between updates and the work of each of its steps, which the train
stage's train() calls in order (the shape of torchtitan's Trainer.train()): `next_update` (the
batches and their tokens on every rank), `update` at the rate train() computes (§5.3), then at a
log, validation or checkpoint point `rewound` (the loss read back: a diverged run goes back to
its last good checkpoint) or `log_and_save`, and `finish`.

It holds the step, the data stream and its position, the loss sums and the seconds trained; the
parts it hands work to are each their own module: the update (learner), when (clock), rewinds
(rewind), the best checkpoints and early stopping (selection), the EMA, validation, the report.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from transformer.core import dist, hardware
from transformer.core.metrics import RUN_ENV
from transformer.core.sections.train import TrainConfig
from transformer.data.batches import BatchSampler, batch_stream
from transformer.training import ema, preempt
from transformer.training.clock import Clock
from transformer.training.learner import Learner, n_targets
from transformer.training.losses import LossSums
from transformer.training.report import Report
from transformer.training.resume import make_checkpoint, restore, started_from, write_checkpoint
from transformer.training.rewind import Rewinder
from transformer.training.selection import STATE, Selection
from transformer.training.validation import ValidBleu, validate


class Loop:
    """One run's loop: built from the learner and the checkpoint it resumes (None: a fresh run),
    it restores the step, the data position, the RNG, the EMA, the rewinds and the selection."""

    def __init__(
        self,
        learner: Learner,
        tcfg: TrainConfig,
        data: Any,
        meta: dict[str, Any],
        resumed: tuple[dict[str, Any] | None, Any],
        ckpt_dir: Path,
        bleu: ValidBleu | None,
        live_dir: Path | None,
        progress_bar: bool,
    ):
        """`data`: its train and valid splits (PairDataset); `resumed`: the checkpoint and its
        path (None: a fresh run); `bleu`: valid BLEU at validation points, if any."""
        self.learner, self.cfg, self.meta, self.ckpt_dir = learner, tcfg, meta, ckpt_dir
        self.train_set, self.valid_set = data.train, data.valid
        self.bleu, self.live_dir = bleu, live_dir
        self.sampler = BatchSampler(
            data.train.src_lens,
            data.train.tgt_lens,
            tcfg.max_tokens,
            tcfg.seed,
            rank=dist.rank(),
            world_size=dist.world_size(),
            static=learner.static,
            group=tcfg.update_freq,
        )
        self.batching = {f"train/{k}": x for k, x in self.sampler.stats.items()}
        self.resume(*resumed)
        self.stream = batch_stream(self.train_set, self.sampler)
        alone_on_cpu = learner.device.type == "cpu" and dist.world_size() == 1
        self.report = Report(
            live_dir, self.step, tcfg.max_steps, progress_bar, cpu=alone_on_cpu, origin=self.origin
        )
        self.losses = LossSums(learner.sums, self.step)
        self.notice = preempt.Notice()  # SIGTERM / SIGUSR1 (main): save the update, stop
        self.batches: list = []
        self.pos: dict[str, int] = {}  # the data position after the update, for its checkpoint
        self.n_tokens, self.lr = 0.0, 0.0
        self.logging = self.validating = self.saving = False
        learner.model.train()

    def resume(self, ckpt: dict[str, Any] | None, path: Any) -> None:
        """Where checkpoint `ckpt` left the run (None: a fresh run): the step and seconds, the
        data position and RNG (resume.restore), the EMA, the clock, the selection, the rewinds."""
        tcfg, learner = self.cfg, self.learner
        self.step, self.seconds = restore(ckpt, path, learner, self.sampler) if ckpt else (0, 0.0)
        # the experiment the flows name: its checkpoints record it (not meta, which must match)
        self.run = os.environ.get(RUN_ENV)
        self.origin = started_from(ckpt, self.run)
        self.ema = ema.start(learner.model, tcfg.ema_decay, ckpt, path)  # None: ema_decay 0
        # (checkpoints from before the `final` flag: the last of their run)
        finished = bool(ckpt and ckpt.get("final", True))
        self.clock = Clock(tcfg, self.step, self.seconds, finished)
        self.select = Selection(tcfg, bleu=self.bleu is not None)  # the best, early stopping
        self.select.load_state_dict(ckpt.get(STATE) if ckpt else None)
        self.clock.stop |= self.select.stopped  # resumed where patience ran out: nothing to do
        state = ckpt.get("rewind") if ckpt else None
        self.rewinder = Rewinder(tcfg, self.ckpt_dir, learner, self.sampler, state)

    def on_ema(self):
        """What validation scores: the EMA's weights when it is on (in and out by load_state)."""
        return self.ema.swapped(self.learner.load_state) if self.ema else contextlib.nullcontext()

    def next_update(self) -> int:
        """The next update's step: its batches drawn, its target tokens summed over the ranks
        (and rank 0's decisions to save and to stop after it: the clock's tick)."""
        self.step += 1
        self.batches = [next(self.stream) for _ in range(self.cfg.update_freq)]
        self.pos = self.batches[-1][0]
        self.n_tokens = self.clock.tick(self.step, sum(n_targets(b) for _, b in self.batches))
        return self.step

    def update(self, lr: float) -> None:
        """The update at rate `lr`, then the test hook, the EMA, the loss sums and the bar."""
        self.lr = lr
        self.learner.step([b for _, b in self.batches], self.n_tokens, lr)  # sums: into losses
        self.rewinder.inject(self.step)  # train.inject_divergence_at, a test hook
        if self.ema:
            self.ema.update()
        self.losses.add(self.n_tokens)
        self.report.bar.update(1)

    def at_point(self) -> bool:
        """Whether the update ends at a log, validation or checkpoint point, or at a preemption
        notice (asked of every rank after every update)."""
        step, clock = self.step, self.clock
        self.logging, self.validating = clock.should_log(step), clock.should_validate(step)
        self.saving = self.notice.agreed() or clock.should_save(step)
        return self.logging or self.validating or self.saving

    def rewound(self) -> bool:
        """The loss read back (rewind.py); if it diverged, the run is back at its last good
        checkpoint, past the diverged batches, with that checkpoint's selection and EMA."""
        back = self.rewinder.read(self.losses, self.step, self.pos)
        if back is None:
            return False
        self.step, self.stream = back, batch_stream(self.train_set, self.sampler)
        self.losses = LossSums(self.learner.sums, back)
        self.select.load_state_dict(self.rewinder.restored.get(STATE))  # its best, its patience
        if self.ema:  # its average too: the diverged updates reached it
            self.ema.load_state_dict(self.rewinder.restored[ema.KEY])
        self.clock.stop = False  # (if it diverged at the last step)
        self.report.rewound(back)
        return True

    def log_and_save(self) -> None:
        """The point's train metrics, validation (a new best is saved; patience may stop the
        run, which saves it too) and checkpoint."""
        logged = self.train_metrics() if self.logging else {}
        if self.validating:
            logged.update(self.validate())
        self.report.log(self.step, logged)
        self.seconds = self.clock.seconds()
        if self.saving:
            self.save()

    def train_metrics(self) -> dict[str, float]:
        taken = self.losses.take()
        logged = {
            **self.report.train_metrics(taken, self.lr, self.clock.seconds()),
            **self.batching,
        }
        return logged | self.rewinder.metrics() | self.learner.metrics()

    def validate(self) -> dict[str, float]:
        """valid/* of the model (the EMA's when it is on), fed to the selection."""
        with self.on_ema():
            v = validate(
                self.learner.model,
                self.valid_set,
                self.cfg,
                self.learner.device,
                self.learner.autocast,
            )
            v.update(self.bleu(self.learner.model) if self.bleu else {})
        self.saving |= self.select.update(self.step, v)  # a new best: its checkpoint is kept
        self.clock.stop |= self.select.stopped
        self.saving |= self.clock.stop
        self.report.pause()
        return {f"valid/{k}": x for k, x in v.items()}

    def save(self) -> None:
        """The update's checkpoint (rank 0 writes it; every rank joins its RNG gather)."""
        le = self.learner
        ckpt = make_checkpoint(
            le.model,
            le.opt,
            le.scaler,
            self.meta,
            self.step,
            self.seconds,
            self.pos,
            self.clock.stop,
        )
        if ckpt is not None:
            ckpt.update(run=self.run, origin=self.origin, rewind=self.rewinder.state_dict())
            ckpt[hardware.KEY] = le.trained_on()  # where and how, to the package
            ckpt[STATE] = self.select.state_dict()
            ema.add_to(ckpt, self.ema)
            path = write_checkpoint(
                self.ckpt_dir, ckpt, self.cfg.keep_last, self.select.best_steps()
            )
            self.report.bar.write(f"step {self.step}: saved {path}")
        self.clock.saved()

    def finish(self) -> dict[str, Any]:
        """The run's end: its metrics where a finished run logged none, why it stopped and the
        best (a preempted run has not stopped: it resumes); what train() returns."""
        report, stopped = self.report, self.notice.stopped
        # nothing trained (the run was already done) and its curves gone (a clone that pulled the
        # checkpoints only): log where it stands, so that the stage's metrics and plots exist
        # again. Rank 0 decides: every rank must join validate's all-reduce, or none.
        if (
            not report.metrics
            and not stopped
            and dist.broadcast_object(
                report.live is not None and not any(Path(self.live_dir, "plots").rglob("*.tsv"))
            )
        ):
            with self.on_ema():
                le = self.learner
                v = validate(le.model, self.valid_set, self.cfg, le.device, le.autocast)
            report.log(self.step, {f"valid/{k}": x for k, x in v.items()})
        outcome = (
            {} if stopped else self.select.summary(self.step, self.cfg.max_steps, self.seconds)
        )
        if report.live is not None:
            report.live.summary.update({**outcome, hardware.KEY: self.learner.trained_on()})
        report.close()
        return {
            "step": self.step,
            "train_seconds": self.seconds,
            "preempted": stopped,
            **report.metrics,
            **outcome,
        }
