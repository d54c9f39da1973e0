"""Average the last k checkpoints into one model (§6.1), as fairseq's average_checkpoints.py.

    python -m transformer.average data/checkpoints data/model.pt
    python -m transformer.average a.pt b.pt c.pt --out avg.pt      # explicit inputs

It streams: one checkpoint is open at a time (memory-mapped, so an optimizer state it carries
is never read) plus one fp32 accumulator. The output holds the averaged weights in the
checkpoints' dtype, the model config, and the list of checkpoints it averaged; no optimizer.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import torch

from transformer.core import failure, hardware, settings
from transformer.core.files import atomic_write, sha256_file
from transformer.core.sections.average import AverageConfig
from transformer.core.settings import ConfigError
from transformer.model import checkpoint
from transformer.model.checkpoint import CheckpointError
from transformer.training import ema

STEP_RE = re.compile(r"step_(\d+)\.pt$")
# what must agree between checkpoints for their weights to be averaged
SIGNATURE_KEYS = ("model_config", "vocab_size", "tokenizer_sha256")
# the newest checkpoint's, into model.pt: its step and time, where and how it trained (the card's)
CARRIED = ("step", "train_seconds", hardware.KEY)


class AverageError(ValueError):
    """A problem with the input checkpoints, naming the file."""


def load_checkpoint(path: Path, finite: bool = False, weights: str = "model") -> dict:
    """checkpoint.load, memory-mapped, its "model" the `weights` asked for (model, or its EMA:
    ema.weights); `finite`: those checked for NaN and inf too. AverageError names the file."""
    try:
        ckpt = checkpoint.load(path, mmap=True)
        ckpt["model"] = ema.weights(ckpt, weights, path)
        if finite:
            checkpoint.check_finite(ckpt["model"], path)
    except CheckpointError as e:
        raise AverageError(str(e)) from None
    return ckpt


def _signature(ckpt: dict) -> tuple:
    shapes = tuple((k, tuple(v.shape), str(v.dtype)) for k, v in ckpt["model"].items())
    return tuple(repr(ckpt.get(k)) for k in SIGNATURE_KEYS) + (shapes,)


def _describe(a: tuple, b: tuple) -> str:
    """Which part of two signatures differs, in words."""
    for name, x, y in zip((*SIGNATURE_KEYS, "weights (names/shapes/dtypes)"), a, b):
        if x != y:
            return f"{name} {_short(y)} vs {_short(x)}"
    return "?"


def _short(x) -> str:
    s = str(x)
    return s if len(s) < 120 else s[:117] + "..."


def check_compatible(paths: list[Path]) -> None:
    """All share one architecture, vocabulary and tokenizer; else name the odd one out."""
    sigs = {p: _signature(load_checkpoint(p)) for p in paths}
    majority, _ = Counter(sigs.values()).most_common(1)[0]
    for p, sig in sigs.items():
        if sig != majority:
            ref = next(q for q, s in sigs.items() if s == majority)
            raise AverageError(f"{p}: differs from {ref.name}: {_describe(majority, sig)}")


def average_checkpoints(paths: list[Path], weights: str = "model") -> dict:
    """The element-wise mean of the `weights` ("model", or their "ema") of the checkpoints at
    `paths`, as a weights-only checkpoint."""
    if not paths:
        raise AverageError("no checkpoints to average")
    paths = [Path(p) for p in paths]
    check_compatible(paths)
    acc: dict[str, torch.Tensor] = {}
    averaged, newest = [], {"step": -1}
    for p in paths:
        ckpt = load_checkpoint(p, finite=True, weights=weights)
        for k, v in ckpt["model"].items():
            if not v.is_floating_point():  # integer buffers can't be averaged: all must agree
                if k in acc and not torch.equal(acc[k], v):
                    raise AverageError(f"{p}: integer tensor {k} differs from {paths[0].name}")
                acc[k] = v.clone()
            elif k in acc:
                acc[k].add_(v.float())  # fp32 accumulator, whatever the checkpoint dtype
            else:
                acc[k] = v.float().clone()  # clone: never write into the mmap'd file
        if ckpt["step"] > newest["step"]:
            # the newest (by step, whatever the order given) names the average's step and time
            newest = {k: v for k, v in ckpt.items() if k in (*SIGNATURE_KEYS, *CARRIED)}
        averaged.append(
            {
                "path": p.name,
                "step": int(ckpt["step"]),
                "train_seconds": float(ckpt.get("train_seconds", 0.0)),
                "sha256": sha256_file(p),
            }
        )
        dtypes = {k: v.dtype for k, v in ckpt["model"].items()}
        del ckpt  # one checkpoint at a time
    model = {
        k: v.div_(len(paths)).to(dtypes[k]) if v.is_floating_point() else v for k, v in acc.items()
    }  # the mean, back in the checkpoints' dtype
    out = {**newest, "model": model, "averaged": averaged}
    return {**out, "weights": "ema"} if weights == "ema" else out  # model.pt says it is an EMA


def _step(p: Path) -> int:
    return int(STEP_RE.search(p.name).group(1))


def select_checkpoints(ckpt_dir: Path, cfg: AverageConfig) -> list[Path]:
    """The last `cfg.last_k` step_*.pt files, oldest first; `by: time` keeps them spaced apart,
    `by: best` takes the train stage's best instead."""
    paths = sorted((p for p in ckpt_dir.glob("step_*.pt") if STEP_RE.search(p.name)), key=_step)
    if not paths:
        raise AverageError(f"{ckpt_dir}: no step_*.pt checkpoints")
    if cfg.by == "steps":
        chosen = paths[-cfg.last_k :]
    elif cfg.by == "best":
        chosen = best_checkpoints(paths, cfg.last_k)
    else:  # "time"
        # §6.1 wrote checkpoints at 10-minute intervals: walk back from the newest, keeping one
        # only if it is at least interval_minutes of training older than the last one kept
        chosen, last_t = [], float("inf")
        for p in reversed(paths):
            t = float(load_checkpoint(p).get("train_seconds", 0.0))
            if last_t - t >= cfg.interval_minutes * 60:
                chosen.insert(0, p)
                last_t = t
            if len(chosen) == cfg.last_k:
                break
    if len(chosen) < cfg.last_k:
        print(
            f"warning: averaging {len(chosen)} checkpoints, fewer than average.last_k={cfg.last_k}",
            file=sys.stderr,
        )
    return chosen


def best_checkpoints(paths: list[Path], k: int) -> list[Path]:
    """The best k of the train stage's best list (train.keep_best by train.best_metric, in the
    newest checkpoint: selection.py), oldest first; AverageError if it has none or one is gone."""
    newest = load_checkpoint(paths[-1])
    best = (newest.get(checkpoint.SELECTION) or {}).get("best") or []
    if not best:
        raise AverageError(
            f"{paths[-1]}: no best checkpoints recorded (average.by: best needs the train "
            "stage's train.keep_best > 0)"
        )
    chosen = [checkpoint.step_path(paths[-1].parent, step) for step, _ in best[:k]]
    for p in chosen:
        if not p.is_file():
            raise AverageError(f"{p}: a best checkpoint the train stage recorded is missing")
    return sorted(chosen, key=_step)


def save(ckpt: dict, out: Path) -> None:
    with atomic_write(out) as f:
        torch.save(ckpt, f)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.average",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "inputs",
        type=Path,
        nargs="+",
        help="a checkpoint directory (step_*.pt, chosen by params `average`) "
        "and the output path; or checkpoint files with --out",
    )
    parser.add_argument("--out", type=Path, help="output path when the inputs are files")
    parser.add_argument(
        "--weights",
        choices=("model", "ema"),
        default="model",
        help="with --out: average the checkpoints' weights or their EMA (train.ema_decay); "
        "from CKPT_DIR params `average.weights` decides",
    )
    parser.add_argument(
        "--params",
        type=Path,
        default=settings.PARAMS,
        help="params.yaml whose `average` section chooses from CKPT_DIR",
    )
    args = parser.parse_args(argv)
    try:
        if args.out is None and len(args.inputs) == 2 and not args.inputs[0].exists():
            raise AverageError(
                f"{args.inputs[0]}: no such checkpoint directory (run the train stage first)"
            )
        if args.out is None and len(args.inputs) == 2 and args.inputs[0].is_dir():
            cfg = settings.load(AverageConfig, "average", args.params)
            paths = select_checkpoints(args.inputs[0], cfg)
            out, weights = args.inputs[1], cfg.weights
        elif args.out is not None and not any(p.is_dir() for p in args.inputs):
            paths, out, weights = args.inputs, args.out, args.weights
        else:
            parser.error("give CKPT_DIR OUT, or CKPT.pt [CKPT.pt ...] --out OUT")
        ckpt = average_checkpoints(paths, weights)
        save(ckpt, out)
    except (AverageError, ConfigError) as e:
        sys.exit(f"error: {e}")
    of = "EMA weights" if weights == "ema" else "average"
    print(f"{out}: {of} of {', '.join(a['path'] for a in ckpt['averaged'])}")


if __name__ == "__main__":
    failure.recorded("average", main)()
