"""How fast the score stage reads a corpus: Multi30k's training pairs scored in both directions
(dual conditional cross-entropy, transformer/model/crossent.py), pairs per second, in one
process, the variants alternating.

    python -m benchmarks.cpu.score_bench --forward PKG --backward PKG [--pairs 29000]
        [--batch-tokens 16384 4096] [--chunk-elements 4194304 262144] [--precision auto]
        [--rounds 2]

PKG: a package folder (model.pt + tokenizer/), e.g. a multi30k-en-de run's data/package and a
German->English one's. Each variant (batch tokens x the output projection's chunk size,
ops.CHUNK_ELEMENTS_CPU) scores the same pairs forward and backward, `--rounds` times in
alternating order; the best round counts. Issue 81's goal: Multi30k's 29k pairs in both
directions under a minute on 2 cores. The load average is printed before and after: discard a
figure taken above 2.5.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from benchmarks.common import SHARED
from transformer.model import ops
from transformer.model.crossent import cross_entropy, load_scorer

M30K = SHARED / "data" / "multi30k"


def one(scorers, src, tgt, batch_tokens: int, chunk: int) -> dict[str, float]:
    ops.CHUNK_ELEMENTS_CPU = chunk
    out = {}
    for role, scorer, (x, y) in (
        ("forward", scorers[0], (src, tgt)),
        ("backward", scorers[1], (tgt, src)),
    ):
        t0 = time.perf_counter()
        cross_entropy(scorer, x, y, batch_tokens, role)
        out[role] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.cpu.score_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--forward", type=Path, required=True, help="an English->German package")
    ap.add_argument("--backward", type=Path, required=True, help="a German->English package")
    ap.add_argument("--pairs", type=int, default=29000, help="the first N of Multi30k's train")
    ap.add_argument("--batch-tokens", type=int, nargs="+", default=[16384, 4096])
    ap.add_argument("--chunk-elements", type=int, nargs="+", default=[ops.CHUNK_ELEMENTS_CPU])
    ap.add_argument("--precision", default="auto", choices=("fp32", "bf16", "auto"))
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    src = (M30K / "train.en").read_text(encoding="utf-8").splitlines()[: args.pairs]
    tgt = (M30K / "train.de").read_text(encoding="utf-8").splitlines()[: args.pairs]
    scorers = [load_scorer(p, args.precision) for p in (args.forward, args.backward)]
    print(
        f"{len(src)} pairs, threads {torch.get_num_threads()}, precision {scorers[0].precision}, "
        f"load before {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    variants = [(b, c) for b in args.batch_tokens for c in args.chunk_elements]
    best: dict[tuple[int, int], dict[str, float]] = {}
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            t = one(scorers, src, tgt, *v)
            prev = best.get(v)
            if prev is None or sum(t.values()) < sum(prev.values()):
                best[v] = t
    base = sum(best[variants[0]].values())
    print(
        "| batch tokens | chunk elements | forward pairs/s | backward pairs/s | both, s | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for v, t in best.items():
        total = sum(t.values())
        print(
            f"| {v[0]} | {v[1]} | {len(src) / t['forward']:.0f} | {len(src) / t['backward']:.0f} "
            f"| {total:.1f} | {base / total:.2f}x |"
        )
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
