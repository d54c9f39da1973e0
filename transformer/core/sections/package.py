"""The package stage's settings (params.yaml `package`): the forms it exports besides its own."""

from __future__ import annotations

from dataclasses import dataclass

from transformer.core.settings import choice


@dataclass
class PackageConfig:
    # hf/: the model as HF's MarianMTModel with its tokenizer and card (docs/export.md); off
    # for a model Marian cannot hold (pre-LN, untied), which the stage otherwise refuses
    hf: bool = True
    # ctranslate2/: none | float32 | int8 (CTranslate2's weight types; needs the `export` extra)
    ctranslate2: str = "none"

    def __post_init__(self) -> None:
        choice("package.ctranslate2", self.ctranslate2, ("none", "float32", "int8"))
