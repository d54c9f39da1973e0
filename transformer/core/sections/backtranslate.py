"""The backtranslate stage's settings (params.yaml `backtranslate`): how the monolingual part is
translated into the source language (read by that stage), and how the synthetic pairs join the
training data (`ratio`, `tag`: read by the tokenizer and shard stages, so that changing them
translates nothing again)."""

from __future__ import annotations

from dataclasses import dataclass

from transformer.core.settings import ConfigError, at_least, choice

# decode.length_penalty's bound, repeated rather than imported: the tokenizer and shard stages
# read this section (tag, ratio) and must not depend on the decode settings' module
MAX_ALPHA = 10.0
SEARCHES = ("beam", "sample")
SYNTHETIC = "synthetic.{lang}"  # the stage's pairs: the translations and the monolingual text
# the keys the backtranslate stage reads (dvc.yaml lists these, not ratio and tag)
STAGE_KEYS = (
    "search",
    "beam_size",
    "length_penalty",
    "topk",
    "seed",
    "max_len_a",
    "max_len_b",
    "batch_tokens",
    "precision",
    "chunk_lines",
)


@dataclass
class BacktranslateConfig:
    # beam: the backward model's beam search (beam_size, length_penalty). sample: one draw per
    # sentence from its distribution (Edunov et al. 2018: better than beam at scale), from the
    # whole vocabulary (topk 0) or from the topk most likely tokens, seeded by `seed`
    search: str = "beam"
    beam_size: int = 4
    length_penalty: float = 0.6
    topk: int = 0
    seed: int = 1
    max_len_a: float = 1.0  # max output length = a * input length + b, as decode's
    max_len_b: int = 50
    batch_tokens: int = 4096  # input tokens per batch, padding included (as decode's)
    precision: str = "fp32"  # fp32 | bf16 | int8 (CPU only), as decode's
    # lines translated, and saved, at a time: a killed run resumes after the last whole chunk
    chunk_lines: int = 5000
    # synthetic pairs mixed into train per real pair (at most: all there are); 0: none
    ratio: float = 1.0
    # a reserved token put before each synthetic source (Caswell et al. 2019, tagged
    # back-translation), e.g. "<BT>": the tokenizer stage adds it as a special token; "": untagged
    tag: str = ""

    def __post_init__(self) -> None:
        choice("backtranslate.search", self.search, SEARCHES)
        choice("backtranslate.precision", self.precision, ("fp32", "bf16", "int8"))
        at_least("backtranslate", self, 1, "beam_size", "batch_tokens", "chunk_lines")
        at_least("backtranslate", self, 0, "topk", "max_len_a", "max_len_b", "ratio")
        if not 0 <= self.length_penalty <= MAX_ALPHA:  # NaN and inf too
            raise ConfigError(
                f"backtranslate.length_penalty must be in [0, {MAX_ALPHA:g}], "
                f"got {self.length_penalty}"
            )
        if self.max_len_a == 0 and self.max_len_b < 1:
            raise ConfigError("backtranslate.max_len_a and max_len_b are both 0: no output")
        if self.tag and (self.tag != self.tag.strip() or len(self.tag.split()) != 1):
            raise ConfigError(
                f"backtranslate.tag must be one token without spaces, e.g. '<BT>', got {self.tag!r}"
            )
