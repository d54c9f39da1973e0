"""The output projection + label-smoothed loss, forward and backward: ops.output_loss against
torch's own F.linear + F.cross_entropy(label_smoothing=), in one process, alternating.

    python -m benchmarks.cpu.loss_bench [--rows 1930] [--vocab 8000 5365] [--d-model 256]
    python -m benchmarks.cpu.loss_bench --step RUN_DIR [--rounds 24]

The defaults are one multi30k-en-de update: ~1,930 target tokens, d_model 256, the joint 8k
vocabulary and the 5,365 units German uses (model.output_vocab: target).
--step times whole training steps instead (forward, loss, backward, Adam) of RUN_DIR's params
model (with the shared softmax) on its train shards: rounds of 10 steps, the same batches for
both losses, in alternating order.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from itertools import islice
from pathlib import Path

import torch
import torch.nn.functional as F

from transformer.core import presets
from transformer.core.allocator import keep_freed_memory
from transformer.core.ids import PAD_ID
from transformer.data.batches import BatchSampler, batch_stream, load_split
from transformer.data.vocab import load_tokenizer
from transformer.model.network import Transformer
from transformer.model.ops import output_loss


def torch_loss(h, w, y, eps):
    return F.cross_entropy(F.linear(h, w), y, label_smoothing=eps, reduction="sum")


def ours(h, w, y, eps):
    return output_loss(h, w, y, eps)[0]


def step_losses(model: Transformer, eps: float) -> dict:
    """The model's training loss through both paths: {name: batch -> summed loss}."""

    def torch_step(b):
        memory, src_pad_mask = model.encode(b.src)
        h = model.decode_features(b.tgt_in, memory, src_pad_mask)  # (B, T, D)
        keep = b.tgt_out.ne(PAD_ID)
        return torch_loss(h[keep], model.output_weight, b.tgt_out[keep], eps)

    return {"torch": torch_step, "ours": lambda b: model.loss(b.src, b.tgt_in, b.tgt_out, eps)[0]}


def time_steps(run: Path, rounds: int) -> None:
    p = presets.load_all(run / "params.yaml")
    mcfg = dataclasses.replace(p["model"], output_vocab="shared")
    tcfg = p["train"]
    data = load_split(run / "data/shards", "train")
    sampler = BatchSampler(data.src_lens, data.tgt_lens, tcfg.max_tokens, tcfg.seed)
    batches = [b for _, b in islice(batch_stream(data, sampler), 200)]  # the train stage's own
    torch.manual_seed(tcfg.seed)
    model = Transformer(mcfg, load_tokenizer(run / "data/tokenizer").size).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    losses = step_losses(model, tcfg.label_smoothing)
    times: dict[str, float] = {"torch": 0.0, "ours": 0.0}
    for r in range(rounds + 1):  # round 0 warms up, untimed
        bs = batches[10 * (r % 20) : 10 * (r % 20) + 10]
        for name in ("torch", "ours") if r % 2 else ("ours", "torch"):
            t = time.perf_counter()
            for b in bs:
                losses[name](b).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            times[name] += (time.perf_counter() - t) if r else 0.0
    n = 10 * rounds
    print(
        f"{n} training steps each: F.linear + F.cross_entropy {n / times['torch']:.2f} steps/s,"
        f" output_loss {n / times['ours']:.2f} steps/s, ratio {times['torch'] / times['ours']:.2f}x"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1930, help="target tokens (N)")
    ap.add_argument("--vocab", type=int, nargs="+", default=[8000, 5365], help="V, one or more")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument(
        "--step",
        type=Path,
        metavar="RUN_DIR",
        help="time whole training steps in this run's checkout instead",
    )
    ap.add_argument("--rounds", type=int, default=24, help="--step: timed rounds of 10 steps")
    args = ap.parse_args(argv)
    keep_freed_memory()  # as the train stage's process does
    if args.step:
        return time_steps(args.step, args.rounds)
    torch.manual_seed(0)
    for V in args.vocab:
        h = torch.randn(args.rows, args.d_model, requires_grad=True)
        w = (torch.randn(V, args.d_model) * args.d_model**-0.5).requires_grad_()
        y = torch.randint(0, V, (args.rows,))
        times: dict[str, list[float]] = {"torch": [], "ours": []}
        for i in range(args.repeats + 3):
            for name, fn in (("torch", torch_loss), ("ours", ours)):
                t = time.perf_counter()
                fn(h, w, y, 0.1).backward()
                if i >= 3:  # warm-up rounds untimed
                    times[name].append(time.perf_counter() - t)
        base, fused = (statistics.median(times[k]) * 1e3 for k in ("torch", "ours"))
        print(
            f"N {args.rows}, V {V}, d {args.d_model}: F.linear + F.cross_entropy {base:.0f} ms,"
            f" output_loss {fused:.0f} ms, ratio {base / fused:.2f}x"
        )


if __name__ == "__main__":
    main()
