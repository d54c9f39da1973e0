"""The model a continued retrain starts from: the champion's package, checked, or nothing.

    python -m transformer.parent data/parent --metrics data/metrics/parent.json

With `retrain.mode: continue` the folder holds a package (model.pt, tokenizer/, lineage.json,
params.yaml) as `dvc artifacts get . transformer --rev V -o data/parent` fetches it (the
retrain flow does), and `retrain.parent` names that version. The stage checks it and leaves its
files as fetched, so DVC's hash of the folder is the package's own. With `scratch` it leaves
only NONE in the folder, so that the stages listing it as a dependency run in any clone. The
metrics name the parent and its ancestors (`chain`, newest first); the package stage copies
them into lineage.json as `parent`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from transformer.core import failure, settings
from transformer.core.files import sha256_file, write_json
from transformer.core.layout import LINEAGE, MODEL, TOKENIZER
from transformer.core.sections.retrain import RetrainConfig
from transformer.core.settings import ConfigError
from transformer.data.vocab import TokenizerError, read_meta, tokenizer_sha256
from transformer.training.continuation import ParentError

NONE = "NONE"  # the only file of the folder in scratch mode


def scratch(parent_dir: Path) -> dict[str, Any]:
    """Empty the folder but for NONE; the metrics of a run with no parent."""
    parent_dir = Path(parent_dir)
    if parent_dir.is_dir():
        shutil.rmtree(parent_dir)
    parent_dir.mkdir(parents=True)
    (parent_dir / NONE).write_text("retrain.mode is scratch: this run starts from no model\n")
    return {"mode": "scratch", "version": None, "chain": []}


def check(parent_dir: Path, version: str) -> dict[str, Any]:
    """The package in `parent_dir`, checked (model and tokenizer belong together); its metrics."""
    parent_dir = Path(parent_dir)
    if not version:
        raise ParentError(
            "retrain.parent is empty: name the version data/parent holds (the retrain flow "
            "sets it; by hand, after dvc artifacts get . transformer --rev V -o data/parent)"
        )
    from transformer.model import (
        checkpoint,  # torch: ~3 s to import, which a scratch run never needs
    )

    model, tok = parent_dir / MODEL, parent_dir / TOKENIZER
    if not model.is_file():
        raise ParentError(
            f"{model}: missing. retrain.mode continue starts from the champion's package: "
            f"rm -r {parent_dir} && dvc artifacts get . transformer --rev {version} "
            f"-o {parent_dir}"
        )
    try:
        ckpt = checkpoint.load(model, mmap=True)
        meta = read_meta(tok)
    except (checkpoint.CheckpointError, TokenizerError) as e:
        raise ParentError(str(e)) from None
    sha = tokenizer_sha256(tok)
    if ckpt.get("tokenizer_sha256") not in (None, sha):
        raise ParentError(f"{tok}: not the tokenizer {model} was trained with")
    lineage_path = parent_dir / LINEAGE
    try:
        scores = json.loads(lineage_path.read_text()) if lineage_path.is_file() else {}
    except ValueError as e:
        raise ParentError(f"{lineage_path}: not valid JSON ({e})") from None
    grand = scores.get("parent") or {}
    before = grand.get("chain") or []
    return {
        "mode": "continue",
        "version": version,
        "model_sha256": sha256_file(model),
        "tokenizer_sha256": sha,
        "src_lang": meta.get("src_lang"),
        "tgt_lang": meta.get("tgt_lang"),
        "step": int(ckpt["step"]),
        # the updates its weights have seen, its ancestors' included (a continuation counts
        # its steps from 1): where the continuation's rate schedule goes on from
        "updates": int(ckpt["step"]) + int(grand.get("updates", grand.get("step")) or 0),
        "bleu": scores.get("bleu"),
        "chain": [version, *before],
    }


def prepare(parent_dir: Path, cfg: RetrainConfig) -> dict[str, Any]:
    """The stage: check the parent (continue) or clear the folder (scratch); the metrics."""
    if cfg.mode == "continue":
        return check(parent_dir, cfg.parent)
    return scratch(parent_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.parent",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("parent", type=Path, help="the parent folder (a package, or NONE)")
    parser.add_argument("--metrics", type=Path, help="write what it holds here (JSON)")
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    args = parser.parse_args(argv)
    try:
        out = prepare(args.parent, settings.load(RetrainConfig, "retrain", args.params))
    except (ParentError, ConfigError, OSError) as e:
        sys.exit(f"error: {e}")
    if args.metrics:
        write_json(args.metrics, out)
    print(f"{args.parent}: " + (f"the parent {out['version']}" if out["version"] else "none"))


if __name__ == "__main__":
    failure.recorded("parent", main)()
