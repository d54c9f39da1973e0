"""The evaluate stage's settings (params.yaml `evaluate`)."""

from __future__ import annotations

from dataclasses import dataclass

from transformer.settings import choice


@dataclass
class EvaluateConfig:
    split: str = "test"
    tokenized_bleu: bool = True  # also the paper's tokenized, compound-split BLEU

    def __post_init__(self) -> None:
        choice("evaluate.split", self.split, ("train", "valid", "test"))
