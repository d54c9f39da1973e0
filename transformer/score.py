"""The score stage: the training pairs that other lines' models find misaligned, dropped (issue 81).

    python -m transformer.score data/raw data/helpers data/corpus --manifest
        data/metrics/download.json --metrics data/metrics/score.json --worst data/worst_pairs.tsv

Dual conditional cross-entropy (Junczys-Dowmunt, WMT 2018, the winner of its corpus filtering
task): the forward model (src -> tgt) and the backward model (tgt -> src), each another line's
champion (data/helpers, the helpers stage's), read every pair with teacher forcing; with their
per-token cross-entropies H_f = H(y|x) and H_b = H(x|y) in nats, a pair's cost is

    |H_f - H_b| + (H_f + H_b) / 2        (lower is better; the paper's score is exp(-cost))

high when either model finds the pair unlikely or the two disagree. With one model only (the
backward one, as mozilla/translations' cross-entropy filter) the cost is its cross-entropy;
with neither, nothing is scored and the metrics say why.

Per part of the train split (the download manifest's, in order), as the crawl filters are
(params.yaml `score`, `score.parts.NAME`): the pairs whose cost is above `threshold` and the
worst `drop_fraction` go; a part whose settings drop nothing is not scored at all.
download.clean.max_drop stops the stage where scoring would drop more of a part or of the split.
data/corpus gets the kept train pairs in their order, and every other file of data/raw (valid,
test) hard-linked byte for byte: evaluation sets are never scored or changed. The tokenizer and
shard stages read it. The metrics count per part what was read, scored and dropped; the TSV
lists the `worst` highest costs (tabs inside a sentence shown as spaces), dropped or not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from transformer.core import failure, settings
from transformer.core.files import atomic_dir, atomic_write, read_lines, sha256_file, write_json
from transformer.core.sections import helpers as roles
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.score import ScoreConfig
from transformer.core.settings import ConfigError

CHUNK = 200_000  # pairs encoded and scored at once: bounds the memory a WMT-sized corpus needs
METHODS = {  # the models there are -> what the cost is
    ("forward", "backward"): "dual conditional cross-entropy (Junczys-Dowmunt 2018)",
    ("backward",): "the backward model's cross-entropy H(src|tgt)",
    ("forward",): "the forward model's cross-entropy H(tgt|src)",
}
TSV_HEAD = "cost\th_forward\th_backward\tpart\tline\tdropped\tsrc\ttgt\n"


class ScoreError(ValueError):
    """Inputs that do not fit together, or scoring that would drop too much; names the file."""


def costs(h_f: np.ndarray | None, h_b: np.ndarray | None) -> np.ndarray:
    """Each pair's cost from the models there are: dual conditional cross-entropy, or one's."""
    if h_f is not None and h_b is not None:
        return np.abs(h_f - h_b) + 0.5 * (h_f + h_b)
    if h_b is None and h_f is None:
        raise ValueError("no model scored the pairs")
    return h_b if h_b is not None else h_f


def drops(cost: np.ndarray, threshold: float, fraction: float) -> np.ndarray:
    """Which pairs go: a cost above `threshold` (0: none), or among the worst `fraction`."""
    out = cost > threshold if threshold > 0 else np.zeros(len(cost), bool)
    n = int(fraction * len(cost))
    if n:
        out[np.argsort(-cost, kind="stable")[:n]] = True  # equal costs: the earlier pair goes
    return out


def train_parts(manifest: dict[str, Any], where: Path, lines: int) -> list[tuple[str, int, int]]:
    """(name, first, end) line ranges of the train split's parts, as data/raw/train holds them."""
    parts = ((manifest.get("splits") or {}).get("train") or {}).get("parts") or {}
    out, start = [], 0
    for name, p in parts.items():
        out.append((name, start, start + int(p.get("kept", 0))))
        start = out[-1][2]
    if start != lines:
        raise ScoreError(
            f"{where}: its train parts hold {start} pairs, the train files {lines}: the "
            "manifest of another download (rerun the download stage)"
        )
    return out


def score_pairs(
    helpers_dir: Path, cfg: ScoreConfig, src: list[str], tgt: list[str], speed: dict
) -> dict[str, np.ndarray]:
    """{role: its model's cross-entropy of each pair} for the roles with a model; `speed`
    gets each model's pairs per second."""
    import torch

    from transformer.model.crossent import cross_entropy, load_scorer  # torch: when scoring

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    speed["threads"] = torch.get_num_threads()
    out = {}
    for role, (x, y) in (("forward", (src, tgt)), ("backward", (tgt, src))):
        pkg = roles.package(helpers_dir, role)
        if pkg is None:
            continue
        scorer, t0 = load_scorer(pkg, cfg.precision), time.perf_counter()
        out[role] = np.concatenate(
            [np.zeros(0)]
            + [
                cross_entropy(scorer, x[i : i + CHUNK], y[i : i + CHUNK], cfg.batch_tokens, role)
                for i in range(0, len(x), CHUNK)
            ]
        )
        seconds = time.perf_counter() - t0
        rate = round(len(x) / max(seconds, 1e-9), 1)
        speed[role] = {
            "seconds": round(seconds, 2),
            "pairs_per_second": rate,
            "precision": scorer.precision,
            "device": scorer.device.type,
        }
    return out


def guard(counts: dict[str, dict[str, Any]], read: int, dropped: int, max_drop: float) -> None:
    """ScoreError where scoring drops more than max_drop of a part or of the split."""
    for where, n, of in [
        *((f"part {k}", c["dropped"], c["read"]) for k, c in counts.items()),
        ("all parts", dropped, read),
    ]:
        if of and n > max_drop * of:
            raise ScoreError(
                f"train: {where}: scoring drops {n} of {of} pairs ({n / of:.1%}), more than "
                f"download.clean.max_drop ({max_drop}); check score.threshold / drop_fraction "
                "and the helpers' languages (or raise max_drop if the corpus is that noisy)"
            )


def score(
    raw: Path,
    helpers_dir: Path,
    out_dir: Path,
    worst: Path,
    cfg: ScoreConfig,
    langs: tuple[str, str],
    manifest: Path,
    max_drop: float = 1.0,
) -> dict[str, Any]:
    """The stage: out_dir (the kept train pairs, every other file of raw linked) and the worst
    pairs' TSV; returns the metrics."""
    paths = [Path(raw) / f"train.{lang}" for lang in langs]
    src, tgt = (read_lines(p, ScoreError) for p in paths)
    if len(src) != len(tgt):
        raise ScoreError(f"{paths[0]} has {len(src)} lines, {paths[1]} {len(tgt)}")
    parts = train_parts(read_manifest(manifest), manifest, len(src))
    names = [name for name, *_ in parts]
    if unknown := [k for k in cfg.parts if k not in names]:
        raise ConfigError(
            f"score.parts.{unknown[0]}: no train part of that name in {manifest} "
            f"(parts: {', '.join(names)})"
        )
    have = tuple(r for r in ("forward", "backward") if roles.package(helpers_dir, r))
    rules = {name: cfg.part(name) for name in names}
    active = {n for n in names if have and (rules[n][0] > 0 or rules[n][1] > 0)}
    spans = [np.arange(a, b) for n, a, b in parts if n in active]
    sel = np.concatenate(spans) if spans else np.zeros(0, np.int64)  # the scored pairs' lines
    speed: dict[str, Any] = {}
    h, cost = {}, np.zeros(0)
    if len(sel):
        h = score_pairs(helpers_dir, cfg, [src[i] for i in sel], [tgt[i] for i in sel], speed)
        cost = costs(h.get("forward"), h.get("backward"))
    gone, counts = select(parts, rules, active, cost)
    guard(counts, len(src), int(gone.sum()), max_drop)
    files = write_corpus(Path(raw), Path(out_dir), paths, (src, tgt), gone)
    write_worst(worst, sel, cost, h, gone, parts, (src, tgt), cfg.worst)
    return {
        "scored": bool(active),
        "method": METHODS[have] if active else None,
        "why": None if active else not_scored(helpers_dir, have),
        "read": len(src),
        "scored_pairs": len(sel),
        "dropped": int(gone.sum()),
        "kept": int((~gone).sum()),
        "parts": counts,
        "speed": speed,
        "cost": summary(cost),
        "files": files,
    }


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ScoreError(f"{path}: not a readable download manifest ({e})") from None


def select(parts, rules: dict, active: set, cost: np.ndarray) -> tuple[np.ndarray, dict]:
    """Which train pairs go (the scored parts' `drops`, `cost` theirs in order) and the counts
    per part."""
    gone = np.zeros(parts[-1][2] if parts else 0, bool)
    counts, at = {}, 0
    for name, a, b in parts:
        scored = b - a if name in active else 0
        if scored:
            gone[a:b] = drops(cost[at : at + scored], *rules[name])
            at += scored
        counts[name] = {
            "read": b - a,
            "scored": scored,
            "dropped": int(gone[a:b].sum()),
            "kept": int((~gone[a:b]).sum()),
            "threshold": rules[name][0],
            "drop_fraction": rules[name][1],
        }
    return gone, counts


def not_scored(helpers_dir: Path, have: tuple[str, ...]) -> str:
    """Why nothing was scored: no model (each role's reason), or settings that drop nothing."""
    if have:
        return "score.threshold and drop_fraction drop nothing in any part"
    return "no model to score with: " + "; ".join(
        f"{r}: {roles.why_none(helpers_dir, r)}" for r in ("backward", "forward")
    )


def summary(cost: np.ndarray) -> dict[str, float] | None:
    """The costs' mean and quantiles (None when nothing was scored)."""
    if not len(cost):
        return None
    q = np.quantile(cost, [0.5, 0.9, 0.99])
    return {
        "mean": round(float(cost.mean()), 4),
        **{k: round(float(v), 4) for k, v in zip(("p50", "p90", "p99"), q)},
    }


def write_corpus(raw: Path, out_dir: Path, paths: list[Path], sides, gone) -> dict[str, Any]:
    """out_dir: the kept train pairs in order, every other file of raw hard-linked (valid and
    test byte for byte); the train files' lines and sha256."""
    with atomic_dir(out_dir) as tmp:
        for f in sorted(raw.iterdir()):
            if f.is_file() and f not in paths:
                _link(f, tmp / f.name)
        for path, side in zip(paths, sides):
            if not gone.any():  # nothing dropped: the file as it is, no second copy on disk
                _link(path, tmp / path.name)
                continue
            with open(tmp / path.name, "w", encoding="utf-8", newline="\n") as fh:
                fh.writelines(s + "\n" for s, g in zip(side, gone) if not g)
        kept = int((~gone).sum())
        return {p.name: {"lines": kept, "sha256": sha256_file(tmp / p.name)} for p in paths}


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # the stages replace files, never rewrite them: a link is safe
    except OSError:
        shutil.copy2(src, dst)


def write_worst(path: Path, sel, cost, h: dict, gone, parts, sides, n: int) -> None:
    """The `n` highest costs as TSV: cost, each model's cross-entropy, part, line (1-based, of
    data/raw/train), whether dropped, both sides."""
    part = np.empty(parts[-1][2] if parts else 0, object)
    for name, a, b in parts:
        part[a:b] = name
    with atomic_write(Path(path), "w", encoding="utf-8", newline="\n") as f:
        f.write(TSV_HEAD)
        for k in np.argsort(-cost, kind="stable")[:n]:
            i = int(sel[k])
            ce = [f"{h[r][k]:.4f}" if r in h else "" for r in ("forward", "backward")]
            text = [s[i].replace("\t", " ") for s in sides]
            dropped = "yes" if gone[i] else "no"
            f.write("\t".join([f"{cost[k]:.4f}", *ce, part[i], str(i + 1), dropped, *text]) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.score",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("raw", type=Path, help="the download stage's folder")
    parser.add_argument("helpers", type=Path, help="the helpers stage's folder (the models)")
    parser.add_argument("out", type=Path, help="the scored corpus folder to write")
    parser.add_argument("--manifest", type=Path, required=True, help="the download manifest")
    parser.add_argument("--metrics", type=Path, help="write the counts here (JSON)")
    parser.add_argument("--worst", type=Path, required=True, help="the worst pairs' TSV")
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    args = parser.parse_args(argv)
    try:
        cfg = settings.load(ScoreConfig, "score", args.params)
        dl = settings.load(DownloadConfig, "download", args.params)
        langs, max_drop = (dl.src_lang, dl.tgt_lang), dl.clean.max_drop
        out = score(
            args.raw, args.helpers, args.out, args.worst, cfg, langs, args.manifest, max_drop
        )
    except (ScoreError, ConfigError, OSError, ValueError) as e:
        sys.exit(f"error: {e}")
    if args.metrics:
        write_json(args.metrics, out)
    said = f"{out['method']}" if out["scored"] else f"not scored ({out['why']})"
    print(f"train: kept {out['kept']} of {out['read']} pairs; {said}")


if __name__ == "__main__":
    failure.recorded("score", main)()
