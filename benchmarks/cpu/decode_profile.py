"""Where our decoding time goes on real sentences: the beam search's parts, then torch's operators.

    python -m benchmarks.cpu.decode_profile data/package data/raw/test.en --threads 1 [--precision fp32]

Translates the file with the package's decode settings (transformer-translate's Translator, its
batches) four times: a warm-up, a plain pass (sentences/s), a pass with a wall-clock timer around
each part of the beam search (the encoder, the decoder step and inside it each layer's
self-attention, cross-attention and the output projection, the candidates' top-k, the caches'
reorder; the rest is the search's Python bookkeeping; it must give the plain pass's outputs), and
a pass under torch.profiler for the operators' self time (the profiler's own cost per operator
inflates the small ones: read it for order, not for shares).
Prints both tables; nothing is asserted but that the timers left the outputs alone.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch
import yaml

from transformer.core.sections.decode import DecodeConfig
from transformer.model import beam, incremental
from transformer.model.translator import load_translator

TIMES: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[name] += time.perf_counter() - t0
            CALLS[name] += 1

    return wrapper


def instrument(dec: incremental.Decoder) -> None:
    """Timers around the search's parts (nested ones are reported inside their parent)."""
    for name in ("encode", "start", "step", "reorder"):
        setattr(dec, name, timed(name, getattr(dec, name)))
    dec._self_attn = timed("step: self-attention", dec._self_attn)
    dec._cross_attn = timed("step: cross-attention", dec._cross_attn)
    dec.logits = timed("step: output projection + logits", dec.logits)
    beam.candidates = timed("candidates (softmax, top-k)", beam.candidates)


def table(total: float, sentences: int, steps: int) -> str:
    rows = [
        "| part | s | share | per step µs |",
        "|---|---|---|---|",
    ]
    parts = dict(TIMES)
    inside = sum(v for k, v in parts.items() if k.startswith("step: "))
    parts["step: the rest (embedding, FFN, LayerNorm, residuals)"] = parts["step"] - inside
    top = sum(v for k, v in parts.items() if not k.startswith("step: "))
    parts["search bookkeeping (Python, tensors of ids)"] = total - top
    for k, v in parts.items():
        rows.append(f"| {k} | {v:.2f} | {v / total:.0%} | {1e6 * v / steps:.0f} |")
    rows.append(f"| total | {total:.2f} | | {1e6 * total / steps:.0f} |")
    return "\n".join(rows) + f"\n\n{sentences} sentences, {steps} decoder steps\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.cpu.decode_profile", description=__doc__
    )
    ap.add_argument("package", type=Path)
    ap.add_argument("src", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"))
    ap.add_argument("--limit", type=int, default=0, help="the first N lines only")
    ap.add_argument("--top", type=int, default=15, help="operators shown")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = args.src.read_text(encoding="utf-8").splitlines()
    lines = lines[: args.limit] if args.limit else lines
    params = yaml.safe_load((args.package / "params.yaml").read_text()) or {}
    cfg = DecodeConfig(**(params.get("decode") or {}))
    tr = load_translator(
        args.package / "model.pt",
        args.package / "tokenizer",
        cfg,
        args.precision,
        (),
        torch.device("cpu"),
    )
    tr.translate(lines)  # warm-up: oneDNN's kernels, the allocator
    t0 = time.perf_counter()
    plain = tr.translate(lines)
    untimed = time.perf_counter() - t0
    instrument(tr.dec)
    t0 = time.perf_counter()
    out = tr.translate(lines)
    total = time.perf_counter() - t0
    assert out == plain, "the timers changed the output"
    print(f"{len(lines) / untimed:.1f} sentences/s without timers, {len(lines) / total:.1f} with\n")
    print(table(total, len(lines), CALLS["step"]))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        tr.translate(lines)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
