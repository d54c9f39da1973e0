r"""Peer adapter (decode only) for ../shared/bench/peers: the project's Transformer and beam search.

    cd ../shared/bench/peers
    PYTHONPATH=CHECKOUT python bench.py decode --shape base --beam 4 --peers hf,ct2_f32 \
        --peer mine=CHECKOUT/benchmarks/cpu/decode_adapter.py:precision=int8

(CHECKOUT: this checkout.) opts: precision=fp32|bf16|int8 (decode.precision). The harness ids
(PAD 0, BOS 1, EOS 2) are the project's. Same workload as the peers: one batch, exactly `length`
tokens (EOS blocked until then, length penalty 1).
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # a plug-in of the peers harness, not a script
    print(__doc__.replace("CHECKOUT", str(Path(__file__).resolve().parents[2])))
    sys.exit(0)

import torch

from benchmarks.cpu.peer_model import build_model
from transformer.core.allocator import keep_freed_memory
from transformer.core.sections.decode import DecodeConfig
from transformer.model.beam import translate_ids
from transformer.model.incremental import Decoder


class Peer:
    def __init__(self, shape: dict, opts: dict):
        self.model = build_model(shape).eval()
        self.precision = opts.get("precision", "fp32")
        self.dec = Decoder(self.model, self.precision)

    def decode(self, src: list[list[int]], beam: int, length: int) -> list[list[int]]:
        cfg = DecodeConfig(beam_size=beam, length_penalty=1.0, batch_tokens=1 << 30)
        return translate_ids(self.dec, src, cfg, min_len=length, max_len=length)

    def info(self) -> dict:
        n = sum(p.numel() for p in self.model.parameters())
        return {
            "peer": "project",
            "precision": self.precision,
            "params": n,
            "torch": torch.__version__,
        }


def build(shape: dict, opts: dict) -> Peer:
    keep_freed_memory()  # as the translate / evaluate processes do
    return Peer(shape, opts)
