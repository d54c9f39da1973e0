"""Valid BLEU during training, greedy against the evaluate stage's beam: each checkpoint of a run
scored as the train stage scores it (transformer/training/validation.py), with beam 1 and with
decode.beam_size, and the seconds each took (docs/experiments/2026-11-27-valid-bleu.md).

    python -m benchmarks.quality.valid_bleu_bench CKPT_DIR TOKENIZER RAW_DIR --params PARAMS
        [--every 2] [--sentences 0]

Prints one row per checkpoint, then the Spearman rank correlation of the two BLEUs over the
checkpoints, each one's best checkpoint, and greedy's share of beam's time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from transformer.core import allocator
from transformer.core.sections.train import TrainConfig
from transformer.model import checkpoint
from transformer.training.validation import ValidBleu, load_valid_text


def ranks(xs: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("ckpt_dir", type=Path)
    parser.add_argument("tokenizer", type=Path)
    parser.add_argument("raw_dir", type=Path)
    parser.add_argument("--params", type=Path, required=True, help="its decode/download sections")
    parser.add_argument("--every", type=int, default=1, help="every n-th checkpoint, the last too")
    parser.add_argument("--sentences", type=int, default=0, help="the first N of valid (0: all)")
    args = parser.parse_args(argv)
    allocator.keep_freed_memory()  # as the train stage does
    paths = checkpoint.list_checkpoints(args.ckpt_dir)
    paths = sorted(set(paths[:: args.every] + paths[-1:]), key=checkpoint.step_of)
    scorers = {
        beam: ValidBleu(
            load_valid_text(
                args.raw_dir,
                TrainConfig(valid_bleu_sentences=args.sentences, valid_bleu_beam_size=beam),
                args.params,
            ),
            args.tokenizer,
            torch.device("cpu"),
        )
        for beam in (1, 0)  # 0: decode.beam_size
    }
    beam_size = scorers[0].text.decode.beam_size
    print(f"| step | greedy BLEU | beam {beam_size} BLEU | greedy s | beam s |", flush=True)
    print("|---|---|---|---|---|", flush=True)
    rows = []
    for p in paths:
        model = checkpoint.build_model(checkpoint.load(p, mmap=True), p)
        g, b = scorers[1](model), scorers[0](model)
        rows.append((checkpoint.step_of(p), g, b))
        print(
            f"| {rows[-1][0]} | {g['bleu']:.2f} | {b['bleu']:.2f} | "
            f"{g['bleu_seconds']:.1f} | {b['bleu_seconds']:.1f} |",
            flush=True,
        )
    greedy, beam = [r[1]["bleu"] for r in rows], [r[2]["bleu"] for r in rows]
    best_g = max(range(len(rows)), key=lambda i: greedy[i])
    best_b = max(range(len(rows)), key=lambda i: beam[i])
    seconds = sum(r[1]["bleu_seconds"] for r in rows) / sum(r[2]["bleu_seconds"] for r in rows)
    print(
        f"\nSpearman(greedy, beam) over {len(rows)} checkpoints: {spearman(greedy, beam):.3f}; "
        f"greedy's best: step {rows[best_g][0]} (beam BLEU {beam[best_g]:.2f}), beam's best: "
        f"step {rows[best_b][0]} ({beam[best_b]:.2f}); greedy time / beam time: {seconds:.2f}"
    )


if __name__ == "__main__":
    main()
