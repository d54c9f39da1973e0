"""The retrain section's settings that stages read (params.yaml `retrain`): how a retrain starts,
from scratch or from the champion, which the parent, tokenizer and train stages read. The
section's flow-only settings (the promotion gate's rules, the continue mode's OOV limit) are
transformer/core/sections/retrain_flow.py's, a module no stage imports, so that editing them reruns
no stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from transformer.core.settings import ConfigError, at_least, choice


@dataclass
class ContinuationConfig:
    """How a `retrain.mode: continue` run trains on from the champion's weights: replaces
    train.max_steps and time_budget_minutes for that run (the rest of `train` applies as it is).
    Its rate is the champion's own: the champion's §5.3 schedule (its package's warmup_steps and
    lr_scale) continued from its update count, never above its last rate, times lr_factor,
    reached over rewarmup_steps. Adam starts afresh (fairseq's --reset-optimizer): the champion's
    package holds the averaged weights, not its optimizer state, hence the short re-warmup."""

    max_steps: int = 150  # updates of the continuation; 0 = until the time budget
    time_budget_minutes: float = 0.0  # training wall time of the continuation; 0 = none
    rewarmup_steps: int = 30  # linear from 0 to the champion's rate over these first updates
    lr_factor: float = 1.0  # times the champion's continued rate (never above its last one)
    # stop after this many validations without an improvement of train.min_delta in
    # train.best_metric (train.patience for the continuation; max_steps / the budget: caps)
    patience: int = 2

    def __post_init__(self) -> None:
        at_least("retrain.continuation", self, 0, "max_steps", "time_budget_minutes", "patience")
        at_least("retrain.continuation", self, 1, "rewarmup_steps")
        if self.lr_factor <= 0:
            raise ConfigError(f"retrain.continuation.lr_factor must be > 0, got {self.lr_factor}")
        if self.max_steps < 1 and self.time_budget_minutes <= 0:
            raise ConfigError(
                "retrain.continuation.max_steps must be >= 1 unless time_budget_minutes is set"
            )


@dataclass
class RetrainConfig:
    """How a retrain starts: from scratch, or from the champion (its tokenizer kept, its weights
    trained on). The champion is a git tag (flows/registry.py); `parent` names the version a
    continued run's data/parent holds."""

    # the section's keys that only the flows read (sections/retrain_flow.py): not read here
    IGNORED: ClassVar[tuple[str, ...]] = (
        "margin",
        "alpha",
        "max_chrf_drop",
        "bootstrap_samples",
        "bootstrap_seed",
        "allow_margin_only",
        "max_oov_rate",
        "max_gap",
        "min_speedup",
    )

    mode: str = "scratch"  # scratch | continue (from the champion; falls back to scratch)
    parent: str = ""  # the registry version in data/parent; set by the retrain flow
    continuation: ContinuationConfig = field(default_factory=ContinuationConfig)

    def __post_init__(self) -> None:
        choice("retrain.mode", self.mode, ("scratch", "continue"))
