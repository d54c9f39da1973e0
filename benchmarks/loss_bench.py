"""The output projection + label-smoothed loss, forward and backward: ops.output_loss against
torch's own F.linear + F.cross_entropy(label_smoothing=), in one process, alternating.

    python benchmarks/loss_bench.py [--rows 1930] [--vocab 8000 5365] [--d-model 256]

The defaults are one multi30k-en-de update: ~1,930 target tokens, d_model 256, the joint 8k
vocabulary and the 5,365 units German uses (model.output_vocab: target).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transformer.ops import output_loss  # noqa: E402


def torch_loss(h, w, y, eps):
    return F.cross_entropy(F.linear(h, w), y, label_smoothing=eps, reduction="sum")


def ours(h, w, y, eps):
    return output_loss(h, w, y, eps)[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1930, help="target tokens (N)")
    ap.add_argument("--vocab", type=int, nargs="+", default=[8000, 5365], help="V, one or more")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
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
        print(f"N {args.rows}, V {V}, d {args.d_model}: F.linear + F.cross_entropy {base:.0f} ms,"
              f" output_loss {fused:.0f} ms, ratio {base / fused:.2f}x")


if __name__ == "__main__":
    main()
