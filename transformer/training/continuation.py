"""A continued retrain's start: the parent package's weights (checked against the run's
tokenizer), its train settings, and the rate schedule it continues (Continuation). The parent
stage (transformer/parent.py) fetches and checks the package; training reads it through here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from transformer.core.layout import LINEAGE, MODEL, PARAMS
from transformer.core.sections.retrain import ContinuationConfig
from transformer.core.sections.train import TrainConfig
from transformer.core.settings import parse_yaml


class ParentError(ValueError):
    """data/parent does not hold what retrain.mode says; the message names the file."""


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
    from transformer.model import checkpoint

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
    from transformer.model import checkpoint

    model = Path(parent_dir) / MODEL
    ckpt = checkpoint.load(model)
    if ckpt.get("tokenizer_sha256") not in (None, tokenizer_sha):
        raise checkpoint.CheckpointError(
            f"{model}: trained with tokenizer {str(ckpt['tokenizer_sha256'])[:12]}, this run's "
            f"is {tokenizer_sha[:12]} (a continued run keeps the parent's tokenizer)"
        )
    return ckpt, model


def start_from_parent(
    model, parent_dir: Path, tokenizer_sha: str, continued: Continuation | None, d_model: int
) -> None:
    """A fresh continuation's start: the parent package's weights into `model`, saying so."""
    from transformer.core import dist
    from transformer.model import checkpoint

    init, init_path = load_parent(parent_dir, tokenizer_sha)
    checkpoint.load_weights(model, init, init_path)
    dist.print0(
        f"continuing from {init_path} (trained {init['step']} steps, "
        f"{continued.updates if continued else init['step']} with its ancestors')"
        + (
            f": its last rate {continued.last_rate(d_model):.3g} x "
            f"{continued.lr_factor}, reached over {continued.rewarmup_steps} updates"
            if continued
            else ""
        )
    )
