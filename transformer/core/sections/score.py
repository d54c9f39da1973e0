"""The score stage's settings (params.yaml `score`): which training pairs the helper models'
cross-entropy drops (dual conditional cross-entropy, Junczys-Dowmunt 2018), per corpus part."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from transformer.core.settings import ConfigError, at_least, choice

PART_KEYS = ("threshold", "drop_fraction")  # what a part may set for itself (score.parts.NAME)


@dataclass
class ScoreConfig:
    # a pair goes when its cost (lower is better) is above `threshold` (0: no threshold) or
    # among the worst `drop_fraction` of its part (0: none); both: either drops it. mozilla's
    # cross-entropy filter drops the worst 5% by the backward model alone.
    threshold: float = 0.0
    drop_fraction: float = 0.05
    # each part's own settings over those two, by the part's name in the download manifest,
    # e.g. the crawl scored and Europarl kept whole: {commoncrawl: {drop_fraction: 0.1},
    # europarl-v7: {drop_fraction: 0}}
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    batch_tokens: int = 16384  # tokens per scoring batch (the longer side, padding included)
    worst: int = 1000  # rows of the worst-pairs TSV (the highest costs, dropped or not)
    # auto: bf16 where the device has it natively (AMX, AVX-512 BF16, a GPU): about twice fp32's
    # pairs a second where measured (an AMX CPU, d_model 256); what matters is the pairs' order
    precision: str = "auto"  # fp32 | bf16 | auto
    threads: int = 0  # torch.set_num_threads; 0 = torch's default (every physical core)

    def __post_init__(self) -> None:
        choice("score.precision", self.precision, ("fp32", "bf16", "auto"))
        at_least("score", self, 1, "batch_tokens")
        at_least("score", self, 0, "worst", "threads")
        self.rules("score", {})
        for name, over in self.parts.items():
            if not isinstance(over, dict):
                raise ConfigError(f"score.parts.{name} must be a mapping, got {over!r}")
            for k in over:
                if k not in PART_KEYS:
                    raise ConfigError(
                        f"unknown key score.parts.{name}.{k} (a part may set: "
                        f"{', '.join(PART_KEYS)})"
                    )
            self.rules(f"score.parts.{name}", over)

    def rules(self, key: str, over: dict[str, Any]) -> tuple[float, float]:
        """(threshold, drop_fraction) of a part: its own settings over the section's."""
        threshold = over.get("threshold", self.threshold)
        fraction = over.get("drop_fraction", self.drop_fraction)
        for name, v in (("threshold", threshold), ("drop_fraction", fraction)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"{key}.{name} must be a number, got {v!r}")
        if threshold < 0:
            raise ConfigError(f"{key}.threshold must be >= 0 (0: none), got {threshold}")
        if not 0.0 <= fraction < 1.0:
            raise ConfigError(f"{key}.drop_fraction must be in [0, 1), got {fraction}")
        return float(threshold), float(fraction)

    def part(self, name: str) -> tuple[float, float]:
        return self.rules(f"score.parts.{name}", self.parts.get(name) or {})
