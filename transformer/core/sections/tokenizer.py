"""The tokenizer stage's settings (params.yaml `tokenizer`)."""

from __future__ import annotations

from dataclasses import dataclass

from transformer.core.settings import choice


@dataclass
class TokenizerConfig:
    # bpe (joint, paper en-de) | wordpiece (paper en-fr) | unigram (SentencePiece's algorithm)
    type: str = "bpe"
    vocab_size: int = 2000  # all units: 4 specials + 256 bytes (x2 for wordpiece) + merges
    min_frequency: int = 2  # a merge must occur this often in the train split (bpe, wordpiece)

    def __post_init__(self) -> None:
        choice("tokenizer.type", self.type, ("bpe", "wordpiece", "unigram"))
