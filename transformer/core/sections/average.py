"""The average stage's settings (params.yaml `average`)."""

from __future__ import annotations

from dataclasses import dataclass

from transformer.core.settings import at_least, choice


@dataclass
class AverageConfig:
    last_k: int = 5  # §6.1: 5 for base, 20 for big
    # steps | time (pick checkpoints at least interval_minutes apart) | best (the train stage's
    # best last_k by train.best_metric, of its train.keep_best)
    by: str = "steps"
    interval_minutes: float = 10.0
    weights: str = "model"  # model | ema: average the checkpoints' EMAs (train.ema_decay > 0)

    def __post_init__(self) -> None:
        choice("average.by", self.by, ("steps", "time", "best"))
        choice("average.weights", self.weights, ("model", "ema"))
        at_least("average", self, 1, "last_k")
        at_least("average", self, 0, "interval_minutes")
