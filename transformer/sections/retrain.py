"""The retrain section's settings (params.yaml `retrain`): the promotion gate (flows/) and how a
retrain starts, from scratch or from the champion, which the parent, tokenizer and train stages
read in continue mode."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformer.settings import ConfigError, at_least, choice


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

    def __post_init__(self) -> None:
        at_least("retrain.continuation", self, 0, "max_steps", "time_budget_minutes")
        at_least("retrain.continuation", self, 1, "rewarmup_steps")
        if self.lr_factor <= 0:
            raise ConfigError(f"retrain.continuation.lr_factor must be > 0, got {self.lr_factor}")
        if self.max_steps < 1 and self.time_budget_minutes <= 0:
            raise ConfigError(
                "retrain.continuation.max_steps must be >= 1 unless time_budget_minutes is set"
            )


@dataclass
class RetrainConfig:
    """The promotion gate and how a retrain starts: from scratch, or from the champion (its
    tokenizer kept, its weights trained on). The champion is a git tag (flows/registry.py);
    `parent` names the version a continued run's data/parent holds."""

    margin: float = 0.0  # promote a candidate only if its BLEU beats the champion's by more
    mode: str = "scratch"  # scratch | continue (from the champion; falls back to scratch)
    # continue falls back to scratch when this share of the new train data's words (of 2+
    # bytes) is left to single bytes by the champion's tokenizer (the shard stage's oov_rate)
    max_oov_rate: float = 0.01
    parent: str = ""  # the registry version in data/parent; set by the retrain flow
    continuation: ContinuationConfig = field(default_factory=ContinuationConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.margin < float("inf"):  # NaN too: it would never promote
            raise ConfigError(f"retrain.margin must be a number >= 0, got {self.margin}")
        choice("retrain.mode", self.mode, ("scratch", "continue"))
        if not 0 <= self.max_oov_rate <= 1:
            raise ConfigError(f"retrain.max_oov_rate must be in [0, 1], got {self.max_oov_rate}")
