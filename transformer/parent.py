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
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from transformer import settings
from transformer.files import sha256_file, write_json
from transformer.sections.retrain import ContinuationConfig, RetrainConfig
from transformer.sections.train import TrainConfig
from transformer.settings import ConfigError, parse_yaml
from transformer.vocab import TokenizerError, read_meta, tokenizer_sha256

MODEL, TOKENIZER, LINEAGE, PARAMS = "model.pt", "tokenizer", "lineage.json", "params.yaml"
NONE = "NONE"  # the only file of the folder in scratch mode


class ParentError(ValueError):
    """data/parent does not hold what retrain.mode says; the message names the file."""


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
    from transformer import checkpoint  # torch: ~3 s to import, which a scratch run never needs

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


def continued_train_config(tcfg: TrainConfig, cont: ContinuationConfig) -> TrainConfig:
    """train's settings with the continuation's length and patience (its rate: Continuation)."""
    return dataclasses.replace(
        tcfg,
        max_steps=cont.max_steps,
        time_budget_minutes=cont.time_budget_minutes,
        patience=cont.patience,
    )


@dataclasses.dataclass(frozen=True)
class Continuation:
    """A continuation's rate: the parent's §5.3 schedule (its warmup and scale) continued from
    the parent's update count, capped at its last rate, times lr_factor, and ramped linearly
    from 0 over rewarmup_steps (a fresh Adam's first moments are noise). A fixed peak does not
    fit every model size and schedule: one above where the parent ended undoes its training."""

    updates: int  # the parent's updates, its ancestors' included
    warmup_steps: int  # the parent's §5.3 warmup ...
    lr_scale: float  # ... and scale
    rewarmup_steps: int
    lr_factor: float

    def base(self, updates: int, d_model: int) -> float:
        """§5.3 at the parent's settings: d_model^-0.5 · min(u^-0.5, u · warmup^-1.5) · scale."""
        u = max(updates, 1)
        return self.lr_scale * d_model**-0.5 * min(u**-0.5, u * self.warmup_steps**-1.5)

    def last_rate(self, d_model: int) -> float:
        """The parent's §5.3 rate at its last update (before any train.lr_decay)."""
        return self.base(self.updates, d_model)

    def rate(self, step: int, d_model: int) -> float:
        """The rate of the continuation's update `step` (from 1)."""
        # a parent stopped inside its warmup would climb on: hold its last rate instead
        on = min(self.base(self.updates + step, d_model), self.last_rate(d_model))
        return self.lr_factor * on * min(1.0, step / self.rewarmup_steps)


def continuation(parent_dir: Path, cont: ContinuationConfig, tcfg: TrainConfig) -> Continuation:
    """The continuation's schedule from the package in `parent_dir`: its update count (model.pt's
    step plus its ancestors', lineage.json) and its train settings (params.yaml; the recipe's
    where a package has none)."""
    from transformer import checkpoint

    parent_dir = Path(parent_dir)
    step = int(checkpoint.load(parent_dir / MODEL, mmap=True)["step"])
    lineage_path, params_path = parent_dir / LINEAGE, parent_dir / PARAMS
    try:
        scores = json.loads(lineage_path.read_text()) if lineage_path.is_file() else {}
        theirs = parse_yaml(params_path.read_text()) if params_path.is_file() else {}
    except (ValueError, yaml.YAMLError) as e:
        raise ParentError(f"{parent_dir}: unreadable {LINEAGE} or {PARAMS} ({e})") from None
    grand = scores.get("parent") or {}
    train = (theirs or {}).get("train") or {}
    return Continuation(
        updates=step + int(grand.get("updates", grand.get("step")) or 0),
        warmup_steps=int(train.get("warmup_steps", tcfg.warmup_steps)),
        lr_scale=float(train.get("lr_scale", tcfg.lr_scale)),
        rewarmup_steps=cont.rewarmup_steps,
        lr_factor=cont.lr_factor,
    )


def load_parent(parent_dir: Path, tokenizer_sha: str) -> tuple[dict[str, Any], Path]:
    """The parent's weights checkpoint and its path; the tokenizer must be the run's."""
    from transformer import checkpoint

    model = Path(parent_dir) / MODEL
    ckpt = checkpoint.load(model)
    if ckpt.get("tokenizer_sha256") not in (None, tokenizer_sha):
        raise checkpoint.CheckpointError(
            f"{model}: trained with tokenizer {str(ckpt['tokenizer_sha256'])[:12]}, this run's "
            f"is {tokenizer_sha[:12]} (a continued run keeps the parent's tokenizer)"
        )
    return ckpt, model


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
    main()
