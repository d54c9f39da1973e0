"""The training loss as the loop reads it: summed on the device, read at log, validation and
checkpoint points (train.py), a non-finite sum stopping the run there (or, caught by rewind.py,
rewinding it)."""

from __future__ import annotations

import math

from torch import Tensor

from transformer.core import dist


class NonFiniteLoss(RuntimeError):
    pass


class LossSums:
    """The loss and NLL summed since they were last read: on the device, since reading them makes
    the host wait for the GPU. Read (summed over ranks) at log, validation and checkpoint points;
    a non-finite sum stops the run there, before any checkpoint of it is written."""

    def __init__(self, sums: Tensor, step: int):
        self.sums = sums  # (loss, nll) since the last read: the updates add to it in place
        self.read_at, self.loss, self.nll, self.tokens = step, 0.0, 0.0, 0.0  # since the last log
        self.unread = 0.0  # target tokens since the last read
        self.last = 0.0  # the loss per token of the updates the last read covered (rewind.py)

    def add(self, n_tokens: float) -> None:
        """An update's target tokens (its sums went into self.sums)."""
        self.tokens += n_tokens
        self.unread += n_tokens

    def read(self, step: int) -> None:
        loss, nll = dist.all_reduce_sum(self.sums).tolist()
        self.sums.zero_()
        self.last, self.unread = loss / max(self.unread, 1.0), 0.0
        if not math.isfinite(loss):  # every rank reads the same sum: all stop together
            steps = f"{self.read_at + 1}-{step}" if step > self.read_at + 1 else f"{step}"
            raise NonFiniteLoss(
                f"non-finite loss ({loss}) at step {steps}; stopping before any "
                "checkpoint of it is written"
            )
        self.read_at, self.loss, self.nll = step, self.loss + loss, self.nll + nll

    def take(self) -> dict[str, float]:
        """Per-token means since the last log, and the tokens they cover; then zero."""
        n = max(self.tokens, 1.0)
        out = {"train/loss": self.loss / n, "train/nll": self.nll / n, "tokens": self.tokens}
        self.loss, self.nll, self.tokens = 0.0, 0.0, 0.0
        return out
