"""Attention on CPU: SDPA against model.py's spelled-out Eq. 1, by op and by whole training step.

    python benchmarks/attention_bench.py                       # the op, at several shapes
    python benchmarks/attention_bench.py --shards data/shards --tokenizer data/tokenizer \\
        --params params.yaml --steps 150 --rounds 3            # and whole training steps

By op: one attention call (random q, k, v; padding masks, or causal) forward + backward under bf16
autocast and in fp32, and forward only (inference mode), timed alternately for each kernel; the
ratio is SDPA's time over the spelled-out one's (> 1: spelled out is faster). `model.spelled_out`
picks the spelled-out path on CPU in bf16 from these figures.

By training step: the train stage's step (`multi30k_mfu.setup`: the params' model, Adam, batches,
precision and threads) in a fresh process per kernel, the kernels alternating over --rounds so
that drift in the host's speed hits both; the first 30 steps are not timed. Run it alone: other
processes on the 2 cores distort it. Nothing is asserted: it prints tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transformer import model as model_py

# (B, h, T, d_k): Multi30k's batches (2048 tokens, T ~20) up to WMT's longer sentences
SHAPES = [(100, 4, 20, 64), (64, 8, 32, 64), (50, 8, 60, 64), (25, 16, 100, 64)]
KERNELS = {
    "sdpa": lambda q, k, v, m, c: F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=c),
    "spelled": model_py.attention,
}


def time_op(kernel: str, shape: tuple, causal: bool, mode: str, n: int) -> float:
    """Milliseconds per call of one kernel: mode is bf16 / fp32 (forward + backward) or infer."""
    B, h, T, d_k = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, T, d_k, generator=g, requires_grad=mode != "infer")
               for _ in range(3))
    lens = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = None if causal else (torch.arange(T) < lens[:, None])[:, None, None, :]  # (B,1,1,T)
    if mode == "infer":
        q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    fn = KERNELS[kernel]
    for i in range(n + 5):
        if i == 5:
            start = time.perf_counter()
        if mode == "infer":
            with torch.inference_mode():
                fn(q, k, v, mask, causal)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
                o = fn(q, k, v, mask, causal)
            o.float().sum().backward()
    return (time.perf_counter() - start) / n * 1e3


def op_table(n: int) -> None:
    print(f"{'shape (B, h, T, d_k)':>22} {'mask':>7} {'mode':>6} {'sdpa ms':>8} "
          f"{'spelled ms':>10} {'ratio':>6}")
    for shape in SHAPES:
        for causal in (False, True):
            for mode in ("bf16", "fp32", "infer"):
                t = {k: [] for k in KERNELS}
                for _ in range(2):  # alternated, best of two each
                    for k in KERNELS:
                        t[k].append(time_op(k, shape, causal, mode, n))
                a, b = min(t["sdpa"]), min(t["spelled"])
                print(f"{shape!s:>22} {'causal' if causal else 'padding':>7} {mode:>6} "
                      f"{a:8.2f} {b:10.2f} {a / b:6.2f}", flush=True)


def child(args: argparse.Namespace) -> None:
    """Steps/s of the train stage's step with one kernel, as a JSON line."""
    from multi30k_mfu import setup  # benchmarks/ is on sys.path: the script's own folder

    if args.child == "sdpa":
        model_py.spelled_out = lambda q: False  # the baseline: SDPA everywhere
    run = setup(args.params, args.shards, args.tokenizer)
    for i in range(args.steps):
        if i == 30:
            start = time.perf_counter()
        run.step(next(run.stream)[1])
    print(json.dumps({"steps_per_s": (args.steps - 30) / (time.perf_counter() - start)}))


def step_table(args: argparse.Namespace) -> None:
    ratios = []
    for r in range(args.rounds):
        speed = {}
        for kernel in (KERNELS if r % 2 == 0 else reversed(KERNELS)):
            cmd = [sys.executable, __file__, "--shards", str(args.shards), "--tokenizer",
                   str(args.tokenizer), "--params", str(args.params), "--steps",
                   str(args.steps), "--child", kernel]
            out = subprocess.run(cmd, check=False, capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"attention_bench: the {kernel} process failed:\n{out.stderr[-2000:]}")
            speed[kernel] = json.loads(out.stdout.splitlines()[-1])["steps_per_s"]
        ratios.append(speed["spelled"] / speed["sdpa"])
        print(f"round {r + 1}: sdpa {speed['sdpa']:.2f} steps/s, spelled out "
              f"{speed['spelled']:.2f} steps/s, {ratios[-1]:.2f}x", flush=True)
    print(f"training step, spelled out / sdpa: median {statistics.median(ratios):.2f}x "
          f"over {len(ratios)} rounds")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=30, help="timed calls per op measurement")
    ap.add_argument("--shards", type=Path, help="also time whole training steps on these shards")
    ap.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer"))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--steps", type=int, default=150, help="training steps per process")
    ap.add_argument("--rounds", type=int, default=3, help="processes per kernel, alternated")
    ap.add_argument("--skip-ops", action="store_true", help="only the training-step table")
    ap.add_argument("--child", choices=KERNELS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if not args.skip_ops:
        op_table(args.calls)
    if args.shards:
        if args.steps <= 30:
            sys.exit("attention_bench: --steps must exceed the 30 untimed warm-up steps")
        step_table(args)


if __name__ == "__main__":
    main()
