"""The retrain section as the flows read it: the stages' settings (sections/retrain.py) plus those
only the flows read, the promotion gate's rules and the continue mode's OOV limit. No stage
imports this module, and no stage lists these keys in dvc.yaml, so editing them reruns nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from transformer.core.sections.retrain import RetrainConfig
from transformer.core.settings import ConfigError, at_least


@dataclass
class RetrainFlowConfig(RetrainConfig):
    """The whole `retrain` section: params.yaml's schema (transformer/config.py) and the flows'."""

    IGNORED: ClassVar[tuple[str, ...]] = ()

    margin: float = 0.0  # promote a candidate only if its BLEU beats the champion's by more
    # ... and sacreBLEU's paired bootstrap test against the champion's hypotheses on the same
    # test set gives p below alpha (flows/significance.py); on every test set scored, a drop
    # with p below alpha refuses it
    alpha: float = 0.05
    max_chrf_drop: float = 1.0  # chrF points a candidate may lose on any test set
    bootstrap_samples: int = 1000  # the test's resamples (sacreBLEU's --paired-bs-n)
    bootstrap_seed: int = 12345  # its RNG seed (sacreBLEU's SACREBLEU_SEED, its default)
    # let BLEU above the margin alone decide where a record never kept hypotheses (no paired
    # test possible); off, such a candidate is refused. Hypotheses that were kept but cannot be
    # read (cache miss, remote down) are refused whatever this says
    allow_margin_only: bool = False
    # continue falls back to scratch when this share of the new train data's words (of 2+
    # bytes) is left to single bytes by the champion's tokenizer (vocab.Subwords.fit)
    max_oov_rate: float = 0.01
    # a student line's (meta.uses.teacher; flows/distilled.py): its BLEU at most max_gap below
    # its teacher's (paired bootstrap on the evaluate split), and at least min_speedup times the
    # teacher's sentences per second (the race stage: same machine and run, one thread, each as
    # served); both, besides beating its own line's champion
    max_gap: float = 1.0
    min_speedup: float = 3.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.margin < float("inf"):  # NaN too: it would never promote
            raise ConfigError(f"retrain.margin must be a number >= 0, got {self.margin}")
        if not 0 < self.alpha <= 1:
            raise ConfigError(f"retrain.alpha must be in (0, 1], got {self.alpha}")
        if not 0 <= self.max_chrf_drop < float("inf"):
            raise ConfigError(
                f"retrain.max_chrf_drop must be a number >= 0, got {self.max_chrf_drop}"
            )
        # seed 0 would leave sacreBLEU's RNG unseeded (`seed if seed else None`): not repeatable
        at_least("retrain", self, 1, "bootstrap_samples", "bootstrap_seed")
        if not 0 <= self.max_oov_rate <= 1:
            raise ConfigError(f"retrain.max_oov_rate must be in [0, 1], got {self.max_oov_rate}")
        if not 0 <= self.max_gap < float("inf"):
            raise ConfigError(f"retrain.max_gap must be a number >= 0, got {self.max_gap}")
        if not 0 < self.min_speedup < float("inf"):
            raise ConfigError(f"retrain.min_speedup must be a number > 0, got {self.min_speedup}")
