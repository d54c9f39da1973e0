"""The evaluate stage's settings (params.yaml `evaluate`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformer.core.settings import ConfigError, choice

SPLITS = ("train", "valid", "test")


@dataclass
class EvaluateConfig:
    split: str = "test"  # the set whose scores are the run's (its BLEU, the gate's margin)
    tokenized_bleu: bool = True  # also the paper's tokenized, compound-split BLEU
    # more sets decoded and scored (under `sets` in the metrics, hypotheses beside the split's):
    # the promotion gate refuses a candidate significantly worse than the champion on any
    extra_splits: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        choice("evaluate.split", self.split, SPLITS)
        for s in self.extra_splits:
            choice("evaluate.extra_splits[]", s, SPLITS)
        if self.split in self.extra_splits or len(set(self.extra_splits)) < len(self.extra_splits):
            raise ConfigError(
                f"evaluate.extra_splits must not repeat a split or evaluate.split "
                f"({self.split!r}), got {self.extra_splits}"
            )
