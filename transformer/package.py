"""The package stage: the model, its tokenizer, its scores and its params in one folder.

    python -m transformer.package data/model.pt data/tokenizer data/metrics/evaluate.json data/package

The folder is dvc.yaml's artifact (what `dvc artifacts get` fetches and a promotion tags) and
what `transformer-translate --model DIR` reads: model.pt, tokenizer/, lineage.json (the
evaluate stage's scores, signatures and hashes) and params.yaml (the settings it was trained and
decoded with). The model and tokenizer are checked to belong together and to the scores.
Files are hard-linked where the file system allows (no second copy on disk), else copied.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from transformer import checkpoint, config, settings
from transformer.checkpoint import CheckpointError
from transformer.files import atomic_dir, sha256_file
from transformer.settings import ConfigError
from transformer.vocab import tokenizer_sha256

MODEL, TOKENIZER, LINEAGE, PARAMS = "model.pt", "tokenizer", "lineage.json", "params.yaml"
NOT_PACKAGED = ("retrain",)  # params sections about orchestration, not the model


class PackageError(ValueError):
    """Parts that do not belong together; the message names the files."""


def package(
    model: Path,
    tokenizer_dir: Path,
    metrics: Path,
    params: dict[str, Any],
    out_dir: Path,
    parent: Path | None = None,
) -> dict[str, Any]:
    """Write out_dir; return its lineage record (with `parent`, the parent stage's metrics:
    the version a continued run started from and its ancestors, where given)."""
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
    if parent is not None:
        try:
            scores["parent"] = json.loads(Path(parent).read_text())
        except (OSError, ValueError) as e:
            raise PackageError(f"{parent}: not a readable metrics file ({e})") from None
    with atomic_dir(Path(out_dir)) as tmp:
        _link(model, tmp / MODEL)
        (tmp / TOKENIZER).mkdir()
        for f in sorted(Path(tokenizer_dir).iterdir()):
            _link(f, tmp / TOKENIZER / f.name)
        (tmp / LINEAGE).write_text(json.dumps(scores, indent=2, ensure_ascii=False) + "\n")
        kept = {k: v for k, v in params.items() if k not in NOT_PACKAGED}
        (tmp / PARAMS).write_text(yaml.safe_dump(kept, sort_keys=False))
    return scores


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
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    args = parser.parse_args(argv)
    try:
        config.load_all(args.params)  # validated before anything is written
        params = settings.read_params(args.params)
        out = package(args.model, args.tokenizer, args.metrics, params, args.out_dir, args.parent)
    except (PackageError, CheckpointError, ConfigError, OSError) as e:
        sys.exit(f"error: {e}")
    print(f"{args.out_dir}: BLEU {out.get('bleu')} ({out.get('split', 'test')})")


if __name__ == "__main__":
    main()
