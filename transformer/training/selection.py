"""Which validations were best, and when training is done: the best train.keep_best checkpoints
by train.best_metric (kept beside the last keep_last, never rotated away), and early stopping
after train.patience validations without an improvement of train.min_delta.

An improvement is a score better than the best so far by more than 0 and by at least min_delta;
the best so far moves only on an improvement (Keras's EarlyStopping). The state travels in every
checkpoint (key "selection"), so that a run resumed after a kill picks up the same best list,
best score and patience count, and the average stage (`average.by: best`) reads the best list
from the newest checkpoint.
"""

from __future__ import annotations

from typing import Any

from transformer.core import dist
from transformer.core.sections.train import TrainConfig
from transformer.model.checkpoint import SELECTION

HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False}
STATE = SELECTION  # the checkpoint key


class Selection:
    """Fed each validation's scores (`update`); says which steps are best and whether to stop."""

    def __init__(self, cfg: TrainConfig, bleu: bool):
        """`bleu`: valid BLEU/chrF are computed (else a bleu or chrf best_metric falls back to
        the valid loss, saying so where it matters)."""
        self.metric = cfg.best_metric if bleu else "loss"
        if self.metric != cfg.best_metric and (cfg.keep_best or cfg.patience):
            dist.print0(
                f"train.best_metric {cfg.best_metric}: no valid BLEU in this run (train."
                "valid_bleu off, or no --raw DIR), so the valid loss chooses the best"
            )
        self.keep, self.patience, self.min_delta = cfg.keep_best, cfg.patience, cfg.min_delta
        self.sign = 1.0 if HIGHER_IS_BETTER[self.metric] else -1.0
        self.best: list[list] = []  # [[step, score], ...], best first (ties: the earlier)
        self.best_score: float | None = None  # the last improvement's score ...
        self.best_step = 0  # ... and step
        self.since_best = 0  # validations since then
        self.bleu_seconds = 0.0  # spent on valid BLEU, across resumes

    @property
    def stopped(self) -> bool:
        """patience validations without an improvement have passed."""
        return 0 < self.patience <= self.since_best

    def update(self, step: int, valid: dict[str, float]) -> bool:
        """One validation's scores at `step`; True when that step is now among the best k (its
        checkpoint must be written)."""
        self.bleu_seconds += valid.get("bleu_seconds", 0.0)
        x = float(valid[self.metric])
        gain = None if self.best_score is None else self.sign * (x - self.best_score)
        if gain is None or (gain > 0 and gain >= self.min_delta):
            self.best_score, self.best_step, self.since_best = x, step, 0
        else:
            self.since_best += 1
        if self.keep == 0:
            return False
        self.best.append([step, x])
        self.best.sort(key=lambda e: (-self.sign * e[1], e[0]))  # best first, then earlier
        del self.best[self.keep :]
        return any(s == step for s, _ in self.best)

    def best_steps(self) -> set[int]:
        return {s for s, _ in self.best}

    def state_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "best": [list(e) for e in self.best],
            "best_score": self.best_score,
            "best_step": self.best_step,
            "since_best": self.since_best,
            "bleu_seconds": self.bleu_seconds,
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """A checkpoint's state (none in one of an older version); another metric's is dropped:
        its scores do not compare with this one's."""
        if not state:
            return
        self.bleu_seconds = state.get("bleu_seconds", 0.0)
        if state["metric"] != self.metric:
            dist.print0(f"best checkpoints by {state['metric']} forgotten: now by {self.metric}")
            return
        self.best = [list(e) for e in state["best"]][: self.keep]
        self.best_score, self.best_step = state["best_score"], state["best_step"]
        self.since_best = state["since_best"]

    def summary(self, step: int, max_steps: int, train_seconds: float) -> dict[str, Any]:
        """The run's outcome for its metrics: why and where it stopped, the best so far, and the
        share of its wall time valid BLEU took."""
        why = "early" if self.stopped else "max_steps" if 0 < max_steps <= step else "time_budget"
        out: dict[str, Any] = {
            "stopped": why,
            "stopped_at": step,
            "best_metric": self.metric,
            "best_step": self.best_step,
            "best_score": self.best_score,
        }
        if self.bleu_seconds:
            out["valid_bleu_seconds"] = round(self.bleu_seconds, 2)
            out["valid_bleu_share"] = round(self.bleu_seconds / max(train_seconds, 1e-9), 4)
        return out
