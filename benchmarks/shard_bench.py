"""Shard generated corpora of 1M and 4.5M pairs; print throughput, peak RSS, loader start-up.

    python benchmarks/shard_bench.py --workdir /tmp/tokshard_bench        # 1M and 4.5M pairs
    python benchmarks/shard_bench.py --pairs 200000 400000

The corpora come from wmt_corpus.make_corpus (reused when present in --workdir); the
tokenizer is the one tokenizer_bench trained there (37k joint BPE on 4.5M pairs) when present,
else a 37k BPE trained here on the first corpus. Each shard run is a fresh process, so its
peak RSS is its own. Goal (issue 5): peak RSS <= 2 GiB, and flat between 1M and 4.5M pairs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from padding_bench import efficiency
from tokenizer_bench import run_stage
from wmt_corpus import ROOT, make_corpus

sys.path.insert(0, str(ROOT))
from transformer.data import BatchSampler, load_split
from transformer.vocab import tokenizer_sha256


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/tokshard_bench"))
    p.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 4_500_000])
    p.add_argument("--max-tokens", type=int, default=25000, help="for the start-up figure")
    args = p.parse_args()
    work = args.workdir
    tok = work / "tok_bpe_37000_4500000"
    if not (tok / "meta.json").exists():
        tok = work / f"tok_bpe_37000_{args.pairs[0]}"
        if not (tok / "meta.json").exists():
            raw = make_corpus(work / f"raw_{args.pairs[0]}", args.pairs[0])
            params = work / "params_bpe_37000.yaml"
            params.write_text("tokenizer: {type: bpe, vocab_size: 37000}\n")
            run_stage(["transformer.tokenizer", str(raw), str(tok), "--params", str(params)], ROOT)
    params = work / "params_shard.yaml"
    params.write_text("shard: {max_len: 256, shard_pairs: 1000000}\n")
    print(f"tokenizer: {tok}")
    head = ["pairs", "wall s", "CPU s", "pairs/s", "peak RSS GiB", "dropped", "shards"]
    print("".join(f"{h:>13}" for h in head))
    for n in args.pairs:
        raw = make_corpus(work / f"raw_{n}", n)
        out, metrics = work / f"shards_{n}", work / f"shard_{n}.json"
        cmd = ["transformer.shard", str(raw), str(tok), str(out), "--params", str(params)]
        wall, cpu, rss = run_stage([*cmd, "--metrics", str(metrics)], ROOT)
        m = json.loads(metrics.read_text())["train"]
        row = [n, f"{wall:.1f}", f"{cpu:.0f}", f"{n / wall:.0f}", f"{rss:.2f}"]
        print("".join(f"{x:>13}" for x in [*row, m["dropped_too_long"], m["shards"]]))
    sha = tokenizer_sha256(tok)
    for verify in (False, True):
        t0 = time.perf_counter()
        ds = load_split(out, "train", sha, verify=verify)
        print(f"load_split({n} pairs, verify={verify}): {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    sampler = BatchSampler(ds.src_lens, ds.tgt_lens, args.max_tokens, seed=1, world_size=8)
    print(
        f"BatchSampler(max_tokens={args.max_tokens}, world_size=8): {len(sampler)} batches "
        f"per rank, built in {time.perf_counter() - t0:.2f} s"
    )
    src, tgt = ds.src_lens.astype(np.int64), ds.tgt_lens.astype(np.int64)
    eff = efficiency(sampler.batches, src, tgt, args.max_tokens)
    print(f"padding efficiency {eff['efficiency']:.2%}, budget fill {eff['fill']:.1%}")
    t0 = time.perf_counter()
    n_tok = sum(sum(len(x) for x in ds[i]) for b in list(sampler)[:50] for i in b)
    print(
        f"read 50 batches ({n_tok} tokens) in {time.perf_counter() - t0:.2f} s; "
        f"mean lengths src {np.mean(ds.src_lens):.1f} tgt {np.mean(ds.tgt_lens):.1f}"
    )


if __name__ == "__main__":
    main()
