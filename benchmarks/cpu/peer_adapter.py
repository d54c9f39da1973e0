r"""The project's Transformer as a peer of ../shared/bench/peers (copied from its template).

    cd ../shared/bench/peers
    PYTHONPATH=CHECKOUT python bench.py train --shape small --rounds 3 \
        --peers ref,ref_bf16,hf,hf_bf16 \
        --peer mine=CHECKOUT/benchmarks/cpu/peer_adapter.py \
        --peer mine_bf16=CHECKOUT/benchmarks/cpu/peer_adapter.py:autocast=bf16

(CHECKOUT: this checkout.) opts: autocast=bf16|off (decoding: decode.precision bf16|fp32);
paper=on drops the attention/activation dropout the shared workload adds (the paper has residual
dropout only, §5.4).
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # a plug-in of the peers harness, not a script
    print(__doc__.replace("CHECKOUT", str(Path(__file__).resolve().parents[2])))
    sys.exit(0)

import torch
from common import BOS, fixed_length_beam_search

from benchmarks.cpu.peer_model import model_config
from transformer.core.allocator import keep_freed_memory
from transformer.core.sections.train import TrainConfig
from transformer.data.batches import Batch
from transformer.model.incremental import Decoder
from transformer.training.learner import Learner


class Peer:
    def __init__(self, shape, opts):
        self.shape = shape
        torch.manual_seed(0)  # the same weights in every sample
        cfg = model_config(shape, paper=opts.get("paper", "off") == "on")
        self.autocast = opts.get("autocast", "off") == "bf16"
        precision = "bf16" if self.autocast else "fp32"
        tcfg = TrainConfig(label_smoothing=shape["label_smoothing"], precision=precision)
        # the train stage's own update (fused Adam, the token-summed loss / target tokens)
        self.learner = Learner(cfg, tcfg, shape["vocab"], None, torch.device("cpu"), precision)
        self.model = self.learner.model

    def train_step(self, b):
        """The train stage's update: token-summed smoothed loss / target tokens, fused Adam."""
        self.model.train()
        self.learner.sums.zero_()
        batch = Batch(b.src, b.tgt_in, b.tgt_out)
        self.learner.step([batch], float(b.n_tgt_tokens), 1e-4)
        return self.learner.sums[0].item() / b.n_tgt_tokens

    @torch.inference_mode()
    def decode(self, src, beam, length):
        """Exactly `length` tokens per sentence, the harness's beam search over the steps of
        incremental.Decoder (the KV caches translate uses)."""
        dec = Decoder(self.model, "bf16" if self.autocast else "fp32")
        x = torch.zeros(len(src), max(map(len, src)), dtype=torch.long)
        for i, s in enumerate(src):
            x[i, : len(s)] = torch.tensor(s)
        state = dec.start(*dec.encode(x), beam, steps=length)

        def step(state, ys):
            return torch.log_softmax(dec.step(ys[:, -1:], state), -1)

        def reorder(state, index):
            dec.reorder(state, index, None)
            return state

        out = fixed_length_beam_search(step, reorder, state, len(src), beam, length, bos=BOS)
        return out.tolist()

    def info(self):
        n = sum(p.numel() for p in self.model.parameters())
        return {"peer": "project", "params_trainable": n, "autocast": self.autocast}


def build(shape, opts):
    keep_freed_memory()  # as the train / translate / evaluate processes do
    return Peer(shape, opts)
