"""Checkpoints: one dict per file, written atomically, read with torch.load(weights_only=True).

Keys (architecture.md): model, model_config, vocab_size, tokenizer_sha256, step, train_seconds;
training checkpoints add optimizer, rng, data, train_config, train_shards, output_ids, final,
rewind (rewind.py), selection (selection.py) and ema (the fp32 moving average of the weights,
with train.ema_decay: ema.py).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import torch

from transformer.core.files import atomic_write
from transformer.core.sections.model import ARCH_KEYS, LATER, ModelConfig
from transformer.core.settings import ConfigError
from transformer.model.network import Transformer

REQUIRED = ("model", "model_config", "vocab_size", "step")
STEP_RE = re.compile(r"step_(\d{8,})\.pt$")
SELECTION = "selection"  # a training checkpoint's best-k list and patience state (selection.py)


class CheckpointError(ValueError):
    """A checkpoint problem, always naming the file (and the key where one is at fault)."""


def save(path: Path, ckpt: dict[str, Any]) -> None:
    """Write `ckpt` to `path` atomically: a kill leaves the old file or the new, never half."""
    missing = [k for k in REQUIRED if k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: refusing to save a checkpoint without key {missing[0]!r}")
    with atomic_write(Path(path), "wb") as f:
        torch.save(ckpt, f)


def load(path: Path, mmap: bool = False) -> dict[str, Any]:
    """The checkpoint dict at `path`; CheckpointError if unreadable or not one of ours.
    `mmap`: tensors are read from disk only when touched (an optimizer state costs nothing)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001  (RuntimeError, UnpicklingError, EOFError, ...)
        # torch's own text for these suggests weights_only=False: never right for a stranger's file
        raise CheckpointError(
            f"{path}: not a readable checkpoint (corrupt, truncated, or not a "
            f"torch checkpoint of plain tensors: {type(e).__name__})"
        ) from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(
            f"{path}: not a checkpoint of this project (a {type(ckpt).__name__}"
            f", expected a dict with keys {', '.join(REQUIRED)})"
        )
    missing = [k for k in REQUIRED if k not in ckpt]
    if missing:
        raise CheckpointError(
            f"{path}: not a checkpoint of this project (missing key {missing[0]!r})"
        )
    return ckpt


def model_config(ckpt: dict[str, Any], path: Path | str = "<checkpoint>") -> ModelConfig:
    """The ModelConfig stored in the checkpoint, with unknown/invalid fields named."""
    stored = ckpt["model_config"]
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = [k for k in stored if k not in names]
    if unknown:
        raise CheckpointError(
            f"{path}: model_config.{unknown[0]} is not a ModelConfig field "
            f"(checkpoint from another version?)"
        )
    try:
        return ModelConfig(**stored)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


def build_model(ckpt: dict[str, Any], path: Path | str = "<checkpoint>") -> Transformer:
    """A Transformer rebuilt from the checkpoint's own config, weights loaded, in eval mode."""
    cfg = model_config(ckpt, path)
    try:  # the model checks output_ids against model_config.output_vocab
        model = Transformer(cfg, int(ckpt["vocab_size"]), ckpt["model"].get("output_ids"))
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    load_weights(model, ckpt, path)
    return model.eval()


def load_weights(model: Transformer, ckpt: dict[str, Any], path: Path | str = "<checkpoint>"):
    """Load ckpt["model"] into an existing model; a mismatch names the key and both shapes."""
    check_compatible(ckpt, model.cfg, model.vocab_size, path)
    state, own = ckpt["model"], model.state_dict()
    for k in own:
        if k not in state:
            raise CheckpointError(f"{path}: model.{k} is missing (another architecture?)")
        if tuple(state[k].shape) != tuple(own[k].shape):
            raise CheckpointError(
                f"{path}: model.{k} has shape {tuple(state[k].shape)}, "
                f"the model expects {tuple(own[k].shape)}"
            )
    extra = [k for k in state if k not in own]
    if extra:
        raise CheckpointError(
            f"{path}: model.{extra[0]} is not in this model (another architecture?)"
        )
    check_finite(state, path)
    model.load_state_dict(state)


def check_finite(state: dict[str, Any], path: Path | str = "<checkpoint>") -> None:
    """CheckpointError naming the first weight that holds NaN or inf: a flipped byte loads
    fine and decodes to nothing (and, averaged, spreads to every checkpoint's mean)."""
    for k, v in state.items():
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise CheckpointError(
                f"{path}: model.{k} holds NaN or inf (a corrupt file, or a run that diverged)"
            )


def check_compatible(
    ckpt: dict[str, Any], cfg: ModelConfig, vocab_size: int, path: Path | str = "<checkpoint>"
) -> None:
    """CheckpointError naming the first differing architecture key of model_config (or vocab)."""
    stored, own = ckpt["model_config"], dataclasses.asdict(cfg)
    stored = {**LATER, **stored}  # a checkpoint from before a key: the value it had then
    for k in ARCH_KEYS:
        v = own[k]
        if k not in stored:
            raise CheckpointError(
                f"{path}: model_config.{k} missing (checkpoint from another version?)"
            )
        if stored[k] != v:
            raise CheckpointError(
                f"{path}: model_config.{k} is {stored[k]!r} in the checkpoint "
                f"but {v!r} here (another architecture)"
            )
    if int(ckpt["vocab_size"]) != vocab_size:
        raise CheckpointError(
            f"{path}: vocab_size is {ckpt['vocab_size']} in the checkpoint "
            f"but {vocab_size} here (another tokenizer)"
        )


def step_path(ckpt_dir: Path, step: int) -> Path:
    return Path(ckpt_dir) / f"step_{step:08d}.pt"


def step_of(path: Path) -> int:
    """The step in a step_XXXXXXXX.pt file's name."""
    return int(STEP_RE.search(Path(path).name).group(1))


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """step_XXXXXXXX.pt files in `ckpt_dir`, oldest step first."""
    paths = [p for p in Path(ckpt_dir).glob("step_*.pt") if STEP_RE.search(p.name)]
    return sorted(paths, key=step_of)
