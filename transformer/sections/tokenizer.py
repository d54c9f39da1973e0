"""The tokenizer stage's settings (params.yaml `tokenizer`)."""

from __future__ import annotations

from dataclasses import dataclass

from transformer.settings import ConfigError


@dataclass
class TokenizerConfig:
    type: str = "bpe"  # bpe (joint, paper en-de) | wordpiece (paper en-fr)
    vocab_size: int = 2000  # all units: 4 specials + 256 bytes (x2 for wordpiece) + merges
    min_frequency: int = 2  # a merge must occur this often in the train split

    def __post_init__(self) -> None:
        if self.type not in ("bpe", "wordpiece"):
            raise ConfigError(f"tokenizer.type must be bpe or wordpiece, got {self.type!r}")
