"""The retrain section's settings that stages read (params.yaml `retrain`): how a retrain starts,
from scratch or from the champion, which the parent, tokenizer and train stages read. The
section's flow-only settings (the promotion gate's margin, the continue mode's OOV limit) are
transformer/sections/retrain_flow.py's, a module no stage imports, so that editing them reruns
no stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from transformer.settings import ConfigError, at_least, choice


@dataclass
class ContinuationConfig:
    """How a `retrain.mode: continue` run trains on from the champion's weights: replaces
    train.max_steps, time_budget_minutes, warmup_steps and lr_scale for that run (the rest of
    `train` applies as it is). Adam starts afresh (fairseq's --reset-optimizer): the champion's
    package holds the averaged weights, not its optimizer state."""

    max_steps: int = 150  # updates of the continuation; 0 = until the time budget
    time_budget_minutes: float = 0.0  # training wall time of the continuation; 0 = none
    warmup_steps: int = 50  # its own §5.3 warmup, from step 1 of the continuation
    lr_scale: float = 0.5  # multiplies its §5.3 rate (peak d_model^-0.5 * warmup^-0.5 * this)

    def __post_init__(self) -> None:
        at_least("retrain.continuation", self, 0, "max_steps", "time_budget_minutes")
        at_least("retrain.continuation", self, 1, "warmup_steps")
        if self.lr_scale <= 0:
            raise ConfigError(f"retrain.continuation.lr_scale must be > 0, got {self.lr_scale}")
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
    IGNORED: ClassVar[tuple[str, ...]] = ("margin", "max_oov_rate")

    mode: str = "scratch"  # scratch | continue (from the champion; falls back to scratch)
    parent: str = ""  # the registry version in data/parent; set by the retrain flow
    continuation: ContinuationConfig = field(default_factory=ContinuationConfig)

    def __post_init__(self) -> None:
        choice("retrain.mode", self.mode, ("scratch", "continue"))
