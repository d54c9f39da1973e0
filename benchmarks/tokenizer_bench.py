"""Train a joint BPE on a generated WMT14-sized corpus (4.5M pairs); print wall time, peak RSS.

    python benchmarks/tokenizer_bench.py --workdir /tmp/tokshard_bench          # 4.5M, 37k BPE
    python benchmarks/tokenizer_bench.py --pairs 200000 --type wordpiece --vocab-size 32000

The corpus is written once to --workdir/raw (reused when present) by wmt_corpus.make_corpus:
real word frequencies plus a WMT-like tail of rare words. The stage runs in a fresh process, so
the printed peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from wmt_corpus import DATA, ROOT, make_corpus


def run_stage(args: list[str], cwd: Path) -> tuple[float, float, float]:
    """Run a stage CLI in a fresh process: (wall s, its CPU s, its peak RSS in GiB)."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"error: {' '.join(args)} failed with exit code {proc.returncode}")
    cpu = usage.ru_utime + usage.ru_stime  # tells contention apart on a shared machine
    return time.perf_counter() - t0, cpu, usage.ru_maxrss / 2**20  # ru_maxrss is in KiB


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/tokshard_bench"))
    p.add_argument("--pairs", type=int, default=4_500_000)
    p.add_argument("--type", default="bpe", choices=["bpe", "wordpiece"])
    p.add_argument("--vocab-size", type=int, default=37000)
    args = p.parse_args()
    if not DATA.is_dir():
        raise SystemExit(f"error: {DATA} not found (../shared/data beside the repo)")
    raw = args.workdir / f"raw_{args.pairs}"
    t0 = time.perf_counter()
    make_corpus(raw, args.pairs)
    size = sum(f.stat().st_size for f in raw.glob("train.*")) / 2**30
    print(f"corpus: {args.pairs} pairs, {size:.2f} GiB of text ({time.perf_counter() - t0:.0f} s)")
    params = args.workdir / f"params_{args.type}_{args.vocab_size}.yaml"
    params.write_text(f"tokenizer: {{type: {args.type}, vocab_size: {args.vocab_size}}}\n")
    out = args.workdir / f"tok_{args.type}_{args.vocab_size}_{args.pairs}"
    metrics = out.with_suffix(".json")
    wall, cpu, rss = run_stage(
        [
            "transformer.tokenizer",
            str(raw),
            str(out),
            "--params",
            str(params),
            "--metrics",
            str(metrics),
        ],
        ROOT,
    )
    m = json.loads(metrics.read_text())
    print(
        f"train {args.type} {m['vocab_size']}: wall {wall:.1f} s (CPU {cpu:.0f} s), "
        f"peak RSS {rss:.2f} GiB, "
        f"{args.pairs / wall:.0f} pairs/s"
    )
    for lang, s in m["valid"].items():
        print(
            f"  valid.{lang}: {s['mean_tokens']} tokens/sentence, "
            f"round trip {s['roundtrip_exact']:.2%}, <unk> {s['unk_share']:.2%}"
        )


if __name__ == "__main__":
    main()
