"""Beam search's settings (params.yaml `decode`), read by evaluate and transformer-translate."""

from __future__ import annotations

from dataclasses import dataclass

from transformer.core.settings import ConfigError, at_least, choice

MAX_ALPHA = 10.0  # GNMT used 0.6-1, the Multi30k preset 2.0; ((5+|Y|)/6)^1e6 overflows


@dataclass
class DecodeConfig:
    beam_size: int = 4  # §6.1
    length_penalty: float = 0.6  # §6.1 alpha
    max_len_a: float = 1.0  # max output length = a * src_len + b (§6.1: src + 50)
    max_len_b: int = 50
    # source tokens per batch, padding included (x beam_size rows): 4096 bounds a CPU's memory;
    # a GPU wants 16384 (docs/decoding.md)
    batch_tokens: int = 4096
    # fp32 | bf16 (weights cast once; on a CPU norms and softmax stay fp32) | int8 (CPU only:
    # dynamic quantization of the Linears)
    precision: str = "fp32"

    def __post_init__(self) -> None:
        choice("decode.precision", self.precision, ("fp32", "bf16", "int8"))
        at_least("decode", self, 1, "beam_size", "batch_tokens")
        at_least("decode", self, 0, "max_len_a", "max_len_b")
        if not 0 <= self.length_penalty <= MAX_ALPHA:  # NaN and inf too
            raise ConfigError(
                f"decode.length_penalty must be in [0, {MAX_ALPHA:g}], got {self.length_penalty}"
            )
        if self.max_len_a == 0 and self.max_len_b < 1:
            raise ConfigError(
                "decode.max_len_a and decode.max_len_b are both 0: no output "
                "could be longer than 0 tokens"
            )
