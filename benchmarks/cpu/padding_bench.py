"""Padding efficiency of the token-budget batches on Multi30k train, against random batching.

Efficiency = real tokens / padded positions, both sides together (a batch of n pairs costs
n * max(src) + n * max(tgt)). Random batching packs shuffled pairs into the same budget.

    python -m benchmarks.cpu.padding_bench                      # max_tokens 4096, BPE 8000
    python -m benchmarks.cpu.padding_bench --max-tokens 25000 --vocab-size 37000 --type wordpiece
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import SHARED
from transformer import shard, tokenizer
from transformer.core.sections.shard import ShardConfig
from transformer.core.sections.tokenizer import TokenizerConfig
from transformer.data.batches import BatchSampler, load_split

DATA = SHARED / "data" / "multi30k"


def efficiency(batches, src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> dict:
    real = padded = fill = 0
    for b in batches:
        real += src[b].sum() + tgt[b].sum()
        padded += len(b) * (src[b].max() + tgt[b].max())
        fill += len(b) * max(src[b].max(), tgt[b].max()) / max_tokens
    return {"efficiency": real / padded, "batches": len(batches), "fill": fill / len(batches)}


def random_batches(src: np.ndarray, tgt: np.ndarray, max_tokens: int, seed: int) -> list:
    """Shuffled pairs, greedily packed into the same padded-token budget."""
    order = np.random.default_rng(seed).permutation(len(src))
    batches, start, longest = [], 0, 0
    for k, i in enumerate(order):
        longest = max(longest, src[i], tgt[i])
        if (k - start + 1) * longest > max_tokens:
            batches.append(order[start:k])
            start, longest = k, max(src[i], tgt[i])
    return batches + [order[start:]]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", type=Path, default=DATA, help="folder with train.{en,de}")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--type", default="bpe", choices=tokenizer.TYPES)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if not (args.data / "train.en").exists():
        raise SystemExit(f"error: {args.data}/train.en not found (../shared/data beside the repo)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        raw = tmp / "raw"
        raw.mkdir()
        for lang in ("en", "de"):  # the shard stage reads raw/train.{lang}
            (raw / f"train.{lang}").symlink_to(args.data / f"train.{lang}")
        cfg = TokenizerConfig(type=args.type, vocab_size=args.vocab_size)
        tokenizer.build(raw, tmp / "tok", cfg, ("en", "de"))
        shard.shard(raw, tmp / "tok", tmp / "shards", ShardConfig(), ("en", "de"))
        ds = load_split(tmp / "shards", "train")
        src, tgt = ds.src_lens.astype(np.int64), ds.tgt_lens.astype(np.int64)
        t0 = time.perf_counter()
        sampler = BatchSampler(src, tgt, args.max_tokens, args.seed)
        built = time.perf_counter() - t0
        ours = efficiency(sampler.batches, src, tgt, args.max_tokens)
        rand = efficiency(
            random_batches(src, tgt, args.max_tokens, args.seed), src, tgt, args.max_tokens
        )
    print(
        f"Multi30k train: {len(src)} pairs, {args.type} {args.vocab_size}, "
        f"mean tokens src {src.mean():.1f} tgt {tgt.mean():.1f} (EOS included), "
        f"max_tokens {args.max_tokens}"
    )
    print(f"{'batching':<16}{'efficiency':>12}{'batches':>10}{'budget fill':>13}")
    for name, r in (("token-budget", ours), ("random", rand)):
        print(f"{name:<16}{r['efficiency']:>11.2%}{r['batches']:>10}{r['fill']:>12.1%}")
    print(f"sampler built in {built:.3f} s")


if __name__ == "__main__":
    main()
