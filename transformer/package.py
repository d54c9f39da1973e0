"""The package stage: the model, its tokenizer, its scores and its params in one folder.

    python -m transformer.package data/model.pt data/tokenizer data/metrics/evaluate.json data/package

The folder is dvc.yaml's artifact (what `dvc artifacts get` fetches and a promotion tags) and
what `transformer-translate --model DIR` reads: model.pt, tokenizer/, lineage.json (the
evaluate stage's scores, signatures and hashes; the parent, the other lines' champions used
and what scoring the corpus dropped), params.yaml (the settings it was trained and
decoded with), curves.svg (the training curves, with --plots), eval/ (the hypotheses behind
the scores, which the promotion gate tests the next candidate against) and README.md (the model card, transformer/core/card.py); with params `package`, also
hf/ (Hugging Face's MarianMTModel) and ctranslate2/ (transformer/export.py, docs/export.md).
The model and tokenizer are checked to belong together and to the scores.
Files are hard-linked where the file system allows (no second copy on disk), else copied.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from transformer import export
from transformer.core import curves, failure, hardware, presets, settings
from transformer.core.card import model_card
from transformer.core.files import atomic_dir, sha256_file
from transformer.core.layout import (
    CARD,
    CT2,
    CURVES,
    EVAL,
    HF,
    LINEAGE,
    MODEL,
    NOT_PACKAGED,
    PARAMS,
    TOKENIZER,
)
from transformer.core.sections.package import PackageConfig
from transformer.core.settings import ConfigError, build
from transformer.data.vocab import tokenizer_sha256
from transformer.model import checkpoint
from transformer.model.checkpoint import CheckpointError


class PackageError(ValueError):
    """Parts that do not belong together; the message names the files."""


def package(
    model: Path,
    tokenizer_dir: Path,
    metrics: Path,
    params: dict[str, Any],
    out_dir: Path,
    parent: Path | None = None,
    manifest: Path | None = None,
    eval_dir: Path | None = None,
    plots_dir: Path | None = None,
    helpers: Path | None = None,
    scoring: Path | None = None,
    raced: Path | None = None,
) -> dict[str, Any]:
    """Write out_dir; return its lineage record (with `parent`, the parent stage's metrics:
    the version a continued run started from and its ancestors, where given). `manifest`: the
    download stage's, for the model card's data section. `eval_dir`: the evaluate stage's
    folder, whose hypotheses the scores name are kept in EVAL (the promotion gate tests the
    next candidate against them). `plots_dir`: the train stage's dvclive plots, drawn into
    CURVES, which the card shows. `helpers`: the helpers stage's metrics (the other lines'
    champions the run used, into lineage.json); `scoring`: the score stage's (what scoring the
    corpus dropped, into lineage.json and the card); `raced`: the race stage's (a student's
    speed and gap against its teacher, into lineage.json and the card)."""
    cfg = build(PackageConfig, params.get("package") or {}, "package", "params.yaml")
    ckpt = checkpoint.load(model, mmap=True)
    want, got = ckpt.get("tokenizer_sha256"), tokenizer_sha256(tokenizer_dir)
    if want and want != got:
        raise PackageError(
            f"{tokenizer_dir}: tokenizer sha256 {got[:12]} is not the one "
            f"{model} was trained with ({want[:12]})"
        )
    try:
        scores = json.loads(Path(metrics).read_text())
    except (OSError, ValueError) as e:
        raise PackageError(f"{metrics}: not a readable metrics file ({e})") from None
    sha = sha256_file(model)
    scored = (scores.get("lineage") or {}).get("model_sha256")
    if scored != sha:
        raise PackageError(
            f"{metrics} scores model {str(scored)[:12]}, not {model} "
            f"({sha[:12]}): run the evaluate stage first"
        )
    if ckpt.get(hardware.KEY):  # where and how it trained (the train stage's record)
        scores[hardware.KEY] = ckpt[hardware.KEY]
    for key, path in (
        ("parent", parent),
        ("helpers", helpers),
        ("score", scoring),
        ("race", raced),
    ):
        if path is not None:
            scores[key] = _read_json(path)
    hyps = [Path(eval_dir) / h for h in scored_hyps(scores)] if eval_dir is not None else []
    if missing := [str(h) for h in hyps if not h.is_file()]:
        raise PackageError(f"{metrics} names hypotheses that are not there: {', '.join(missing)}")
    with atomic_dir(Path(out_dir)) as tmp:
        _link(model, tmp / MODEL)
        if hyps:
            (tmp / EVAL).mkdir()
        for h in hyps:
            _link(h, tmp / EVAL / h.name)
        (tmp / TOKENIZER).mkdir()
        for f in sorted(Path(tokenizer_dir).iterdir()):
            _link(f, tmp / TOKENIZER / f.name)
        (tmp / LINEAGE).write_text(json.dumps(scores, indent=2, ensure_ascii=False) + "\n")
        kept = {k: v for k, v in params.items() if k not in NOT_PACKAGED}
        (tmp / PARAMS).write_text(yaml.safe_dump(kept, sort_keys=False))
        data = _read_json(manifest) if manifest is not None else None
        trained = {k: ckpt.get(k) for k in ("step", "train_seconds")}
        svg = curves.card_svg(plots_dir) if plots_dir is not None else None
        if svg is not None:
            (tmp / CURVES).write_text(svg, encoding="utf-8")
        card = model_card(scores, kept, data, trained, revision(), curves=svg is not None)
        (tmp / CARD).write_text(card, encoding="utf-8")
        try:
            if cfg.hf:
                (tmp / HF).mkdir()
                export.write_hf(tmp, tmp / HF)
            if cfg.ctranslate2 != "none":
                export.write_ctranslate2(tmp, tmp / CT2, cfg.ctranslate2)
        except export.ExportError as e:
            raise PackageError(
                f"{e} (params.yaml package.hf: false and package.ctranslate2: none package it "
                "without the exports)"
            ) from None
    return scores


def scored_hyps(scores: dict[str, Any]) -> list[str]:
    """The hypotheses files the evaluate stage's metrics name: its split's and its extra sets'."""
    sets = [scores, *(scores.get("sets") or {}).values()]
    return [r["hyps"] for r in sets if r.get("hyps")]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise PackageError(f"{path}: not a readable metrics file ({e})") from None


def revision() -> str:
    """The code's git commit (with -dirty for uncommitted edits), or "unknown" outside git."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=40"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # the stages replace files, never rewrite them: a link is safe
    except OSError:
        shutil.copy2(src, dst)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.package",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", type=Path, help="the averaged checkpoint")
    parser.add_argument("tokenizer", type=Path, help="tokenizer directory")
    parser.add_argument("metrics", type=Path, help="the evaluate stage's metrics JSON")
    parser.add_argument("out_dir", type=Path, help="the package folder to write")
    parser.add_argument(
        "--parent", type=Path, help="the parent stage's metrics JSON (into lineage.json)"
    )
    parser.add_argument(
        "--manifest", type=Path, help="the download stage's manifest (into the model card)"
    )
    parser.add_argument(
        "--helpers", type=Path, help="the helpers stage's metrics JSON (into lineage.json)"
    )
    parser.add_argument(
        "--score", type=Path, help="the score stage's metrics JSON (into lineage.json, the card)"
    )
    parser.add_argument(
        "--race", type=Path, help="the race stage's metrics JSON (into lineage.json, the card)"
    )
    parser.add_argument(
        "--eval", type=Path, help="the evaluate stage's folder (its hypotheses into eval/)"
    )
    parser.add_argument(
        "--plots", type=Path, help="the train stage's dvclive plots (drawn into curves.svg)"
    )
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    args = parser.parse_args(argv)
    try:
        presets.load_all(args.params)  # validated before anything is written
        params = settings.read_params(args.params)
        out = package(
            args.model,
            args.tokenizer,
            args.metrics,
            params,
            args.out_dir,
            args.parent,
            args.manifest,
            args.eval,
            args.plots,
            args.helpers,
            args.score,
            args.race,
        )
    except (PackageError, CheckpointError, ConfigError, OSError) as e:
        sys.exit(f"error: {e}")
    print(f"{args.out_dir}: BLEU {out.get('bleu')} ({out.get('split', 'test')})")


if __name__ == "__main__":
    failure.recorded("package", main)()
