"""Attention on CPU: SDPA against network.py's spelled-out Eq. 1 (`network.attention`), by op.

    python -m benchmarks.cpu.attention_bench [--calls 30]

By op: one attention call (random q, k, v; padding masks, or causal) forward + backward under bf16
autocast and in fp32, and forward only (inference mode), timed alternately for each kernel; the
ratio is SDPA's time over the spelled-out one's (> 1: spelled out is faster). Run it alone:
other processes on the 2 cores distort it. Nothing is asserted: it prints a table.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from transformer.model.network import attention

# (B, h, T, d_k): Multi30k's batches (2048 tokens, T ~20) up to WMT's longer sentences
SHAPES = [(100, 4, 20, 64), (64, 8, 32, 64), (50, 8, 60, 64), (25, 16, 100, 64)]
KERNELS = {
    "sdpa": lambda q, k, v, m, c: F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=c),
    "spelled": attention,
}


def time_op(kernel: str, shape: tuple, causal: bool, mode: str, n: int) -> float:
    """Milliseconds per call of one kernel: mode is bf16 / fp32 (forward + backward) or infer."""
    B, h, T, d_k = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(B, h, T, d_k, generator=g, requires_grad=mode != "infer") for _ in range(3)
    )
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
    print(
        f"{'shape (B, h, T, d_k)':>22} {'mask':>7} {'mode':>6} {'sdpa ms':>8} "
        f"{'spelled ms':>10} {'ratio':>6}"
    )
    for shape in SHAPES:
        for causal in (False, True):
            for mode in ("bf16", "fp32", "infer"):
                t = {k: [] for k in KERNELS}
                for _ in range(2):  # alternated, best of two each
                    for k in KERNELS:
                        t[k].append(time_op(k, shape, causal, mode, n))
                a, b = min(t["sdpa"]), min(t["spelled"])
                print(
                    f"{shape!s:>22} {'causal' if causal else 'padding':>7} {mode:>6} "
                    f"{a:8.2f} {b:10.2f} {a / b:6.2f}",
                    flush=True,
                )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=30, help="timed calls per op measurement")
    args = ap.parse_args(argv)
    op_table(args.calls)


if __name__ == "__main__":
    main()
