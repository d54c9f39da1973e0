"""Training throughput of the project's model against its peers, side by side in one run.

Runs ../shared/bench/peers/bench.py (fresh process per sample, peers rotated each round) with
the torch.nn.Transformer reference and HF MarianMTModel, each in fp32 and bf16 autocast, plus
this project's model (benchmarks/cpu/peer_adapter.py) in both modes, and prints target tokens/s, the
ratio to the fastest peer (goal: >= 1.3x) and MFU against the GEMM peak of RESULTS.md.

    python -m benchmarks.cpu.train_bench --shape small --rounds 3
    python -m benchmarks.cpu.train_bench --shape base --rounds 2 --python /tmp/perf/venv/bin/python

The peers need `transformers` in a separate venv (../shared/bench/peers/README.md, Setup).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import PEERS_DIR, ROOT

ADAPTER = Path(__file__).resolve().parent / "peer_adapter.py"
PEAK_GFLOPS = {"fp32": 216.0, "bf16": 930.0}  # RESULTS.md §1: best median GEMM per dtype
PEERS = ("ref", "ref_bf16", "hf", "hf_bf16")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", default="small", choices=["small", "base"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--python", default=os.environ.get("PEERS_VENV", "/tmp/perf/venv/bin/python"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/perf/train_bench.jsonl"))
    ap.add_argument("--peers", default=",".join(PEERS), help="comma list of bench.py peers")
    args = ap.parse_args(argv)
    if not Path(args.python).exists():
        sys.exit(f"error: {args.python}: no peers venv (see {PEERS_DIR}/README.md, Setup)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.unlink(missing_ok=True)
    # the train stage's settings: fp32, or train.precision bf16
    mine = [f"mine={ADAPTER}@{args.python}", f"mine_bf16={ADAPTER}:autocast=bf16@{args.python}"]
    cmd = [
        args.python,
        "bench.py",
        "train",
        "--shape",
        args.shape,
        "--rounds",
        str(args.rounds),
        "--steps",
        str(args.steps),
        "--peers",
        args.peers,
        "--out",
        str(args.out),
    ]
    cmd += [x for m in mine for x in ("--peer", m)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PEERS_VENV": args.python}
    subprocess.run(cmd, cwd=PEERS_DIR, env=env, check=True)
    report([json.loads(line) for line in args.out.read_text().splitlines()], args.shape)


def report(rows: list[dict], shape: str) -> None:
    """Per peer: median tok/s, MFU; mine vs the fastest peer, as median per-round paired ratios."""
    by: dict[str, dict[int, dict]] = {}
    for r in rows:
        if "error" not in r:
            by.setdefault(r["peer"], {})[r["round"]] = r
    print(f"\n{shape}: target tokens/s (median over rounds), MFU vs GEMM peak")
    for name, rs in by.items():
        tok = statistics.median(r["tgt_tokens_per_s"] for r in rs.values())
        gf = statistics.median(r["useful_gflops_per_s"] for r in rs.values())
        peak = PEAK_GFLOPS["bf16" if "bf16" in name else "fp32"]
        print(f"  {name:10s} {tok:9.0f} tok/s   MFU {100 * gf / peak:5.1f}%")
    peers = [n for n in by if not n.startswith("mine")]
    for mine in (n for n in by if n.startswith("mine")):
        ratios = []
        for rnd, r in by[mine].items():
            best = max(
                (by[p][rnd]["tgt_tokens_per_s"] for p in peers if rnd in by[p]), default=None
            )
            if best:
                ratios.append(r["tgt_tokens_per_s"] / best)
        if ratios:
            print(
                f"  {mine} / fastest peer (paired per round): "
                f"{statistics.median(ratios):.2f}x  [{min(ratios):.2f}-{max(ratios):.2f}]"
            )


if __name__ == "__main__":
    main()
