"""Exact resume: which checkpoint a run continues from, and what a training checkpoint holds.

A run continues from the newest checkpoint in its directory only if a fresh run with today's
params.yaml would pass through it (same model, tokenizer, shards, batching, rate, ...); then it
restores the weights, Adam, the schedule, every rank's RNG and the data position, and ends with
the same weights as an uninterrupted run (CPU, same process count). Otherwise the old checkpoints
are moved aside, whole, into CKPT_DIR.aside/ (another recipe's run may want them back) and the run
starts afresh. Only rank 0 writes checkpoints.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from transformer.core import dist
from transformer.core.files import remove_partial_writes
from transformer.core.sections.train import TrainConfig
from transformer.model import checkpoint
from transformer.model.checkpoint import CheckpointError

# train_config keys that do not change the weights up to a checkpoint: a checkpoint differing
# only in these is resumed; any other difference (rate, batching, precision, ...) starts afresh,
# so that the result is always what a fresh run with today's params.yaml would give.
RESUME_FREE_KEYS = frozenset(
    {
        "max_steps",
        "time_budget_minutes",
        "valid_every_steps",
        "log_every_steps",
        "threads",
        "keep_last",
        "save_every_steps",
        "save_every_minutes",
        "max_rewinds",  # raised after a run failed past it: go on from its last checkpoint
        # what is scored and kept, and when to stop: not the weights (selection.py)
        "valid_bleu",
        "valid_bleu_sentences",
        "valid_bleu_beam_size",
        "best_metric",
        "keep_best",
        "patience",
        "min_delta",
        # the update's path: the same update (learner.py), eager, captured or compiled, so a
        # run switched off a failing capture or compile goes on from its checkpoints
        "graphs",
        "compile",
    }
)


UNREADABLE = "unreadable"  # the subfolder of CKPT_DIR where unreadable checkpoints are moved
# Another recipe's checkpoints go to the sibling CKPT_DIR.aside/, not into CKPT_DIR: that is the
# train stage's output, which DVC hashes and the average stage reads. The newest KEEP_ASIDE sets
# are kept there; older ones are deleted, each named in the log.
ASIDE_SUFFIX, KEEP_ASIDE = ".aside", 3


def newest_readable(ckpt_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, and it. Newer ones that do not (truncated by a full
    disk or a dying machine) are moved to CKPT_DIR/unreadable/, each named in a warning: a crashed
    run's retry then continues from the checkpoint before instead of failing on it."""
    for path in reversed(checkpoint.list_checkpoints(ckpt_dir)):
        try:
            return path, checkpoint.load(path)
        except CheckpointError as e:
            aside = Path(ckpt_dir) / UNREADABLE / path.name
            aside.parent.mkdir(exist_ok=True)
            path.replace(aside)
            dist.print0(f"warning: {e}; moved to {aside}, resuming from the one before")
    return None


def find_resume(ckpt_dir: Path, meta: dict[str, Any]) -> tuple[Path | None, str]:
    """(newest readable checkpoint to continue from, or None, and why not)."""
    found = newest_readable(ckpt_dir)
    if found is None:
        return None, "no readable checkpoint"
    path, ckpt = found
    for key, want in meta.items():
        have = ckpt.get(key)
        if key == "train_config" and isinstance(have, dict):
            # a setting newer than the checkpoint: it trained as that setting's default does
            have = {**dataclasses.asdict(TrainConfig()), **have}
            # with a decay, max_steps / the budget shape the rate from the first step on
            free = (
                RESUME_FREE_KEYS
                if want["lr_decay"] == "none"
                else RESUME_FREE_KEYS - {"max_steps", "time_budget_minutes"}
            )
            have = {k: v for k, v in have.items() if k not in free}
            want = {k: v for k, v in want.items() if k not in free}
        if have != want:
            keys = (
                sorted(k for k in want if have.get(k) != want[k])
                if (isinstance(have, dict) and isinstance(want, dict))
                else []
            )
            return None, f"{path}: {key} differs" + (f" {keys}" if keys else "")
    max_steps = meta["train_config"]["max_steps"]
    if 0 < max_steps < ckpt["step"]:  # fewer steps than done: only a fresh run gives that model
        return None, f"{path}: step {ckpt['step']} is past train.max_steps {max_steps}"
    budget, seconds = meta["train_config"]["time_budget_minutes"], ckpt.get("train_seconds", 0.0)
    before = (ckpt.get("train_config") or {}).get("time_budget_minutes") or 0.0
    if 0 < budget < (before or float("inf")) and 60 * budget < seconds:
        # a budget lowered below the time trained: a fresh run would stop sooner. (A finished
        # run's last checkpoint is always a little past its own budget: that is not lowered.)
        return None, (
            f"{path}: {seconds:.0f} s of training are past the lowered "
            f"train.time_budget_minutes {budget:g}"
        )
    if "optimizer" not in ckpt:
        return None, f"{path}: not a training checkpoint (no optimizer state)"
    return path, ""


def started_from(ckpt: dict[str, Any] | None, run: str | None) -> dict[str, Any] | None:
    """Where the checkpoints of run `run` began, when it resumed another run's (the run
    workspace keeps one set of checkpoints, and a run that differs only in max_steps or
    save_every_steps goes on from them): that run, its step and training seconds; None for a
    fresh run. A run's resume of its own checkpoint (a retry) keeps what they recorded."""
    if ckpt is None:
        return None
    if ckpt.get("run") == run:
        return ckpt.get("origin")
    return {
        "from": ckpt.get("run") or "-",
        "step": int(ckpt["step"]),
        "seconds": ckpt["train_seconds"],
    }


def make_checkpoint(
    model, opt, scaler, meta, step, seconds, data, final: bool
) -> dict[str, Any] | None:
    """The checkpoint dict on rank 0 (None elsewhere); every rank must call it (RNG gather)."""
    rng = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
    }
    rngs = dist.all_gather_object(rng)  # every rank's dropout stream, for an exact resume
    if not dist.is_main():
        return None
    return {
        **meta,
        "model": model.state_dict(),
        "step": step,
        "train_seconds": seconds,
        "final": final,  # the run's last: a resume at the same budget trains nothing
        "optimizer": opt.state_dict(),
        "scheduler": {"step": step},
        "scaler": scaler.state_dict() if scaler.is_enabled() else None,
        "rng": rngs,
        "data": data,
    }


def write_checkpoint(
    ckpt_dir: Path, ckpt: dict[str, Any], keep_last: int, keep_steps: set[int] = frozenset()
) -> Path:
    path = checkpoint.step_path(ckpt_dir, ckpt["step"])
    checkpoint.save(path, ckpt)
    if keep_last > 0:  # the last K kept (§6.1 averages the last 5 or 20), and `keep_steps`
        for old in checkpoint.list_checkpoints(ckpt_dir)[:-keep_last]:  # (the best: selection.py)
            if checkpoint.step_of(old) not in keep_steps:
                old.unlink(missing_ok=True)
    return path


# How this run's Adam steps, not the saved run's: Optimizer.load_state_dict restores a group's
# every key, so a checkpoint of an eager run (a CPU, fp16, graphs off) would turn a captured
# update's capturable Adam back into one whose capture fails.
HOW = ("capturable", "fused", "foreach", "differentiable")


def load_optimizer(opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """opt's saved state (moments, steps, rate), its param groups keeping HOW as built now; the
    step counts land where that wants them (the device for capturable or fused)."""
    groups = [
        {**saved, **{k: now[k] for k in HOW if k in now}}
        for saved, now in zip(state["param_groups"], opt.param_groups)
    ]
    opt.load_state_dict({**state, "param_groups": groups})


def restore(ckpt: dict[str, Any], path: str, learner, sampler) -> tuple[int, float]:
    """Load weights, Adam, scaler (Learner.load_state), data position and this rank's RNG;
    (step, seconds)."""
    learner.load_state(ckpt, path)
    rng = ckpt["rng"][dist.rank()]
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    sampler.load_state_dict(ckpt["data"])
    return int(ckpt["step"]), float(ckpt["train_seconds"])


def load_resume(
    ckpt_dir: Path, meta: dict[str, Any], resume: bool
) -> tuple[dict[str, Any] | None, str]:
    """(checkpoint, its path), or (None, ""): rank 0 picks it; every rank gets it (from disk, or
    broadcast if not shared). Only rank 0 looks: another rank could list a stale checkpoint as
    rank 0 removes it."""
    path = None
    if dist.is_main():
        path, why = find_resume(ckpt_dir, meta) if resume else (None, "--resume not given")
        remove_partial_writes(ckpt_dir, "step_*.pt")  # of a process killed while it saved
        if path is None:  # the unreadable ones of the run that is being replaced
            shutil.rmtree(Path(ckpt_dir) / UNREADABLE, ignore_errors=True)
        stale = checkpoint.list_checkpoints(ckpt_dir)
        if path is None and stale:  # a fresh run: older checkpoints would mix into averaging
            aside = move_aside(Path(ckpt_dir))
            dist.print0(
                f"not resuming ({why}): {len(stale)} checkpoint(s) of an earlier run in "
                f"{ckpt_dir} moved aside to {aside}; this run counts its steps from 1"
            )
    path = dist.broadcast_object(str(path) if path else None)
    if path is None:
        return None, ""
    visible = all(dist.all_gather_object(Path(path).is_file()))
    ckpt = checkpoint.load(Path(path)) if visible or dist.is_main() else None
    ckpt = ckpt if visible else dist.broadcast_object(ckpt)
    dist.print0(f"resuming from {path} (step {ckpt['step']})")
    return ckpt, path


def aside_root(ckpt_dir: Path) -> Path:
    """CKPT_DIR.aside beside the real folder (a symlinked CKPT_DIR: beside its target, on the
    same filesystem, so that a set moves by one rename)."""
    real = Path(ckpt_dir).resolve()
    return real.with_name(real.name + ASIDE_SUFFIX)


def move_aside(ckpt_dir: Path, keep: int = KEEP_ASIDE) -> Path:
    """Move CKPT_DIR's contents, whole, to CKPT_DIR.aside/<UTC time>-step<newest step>/ and
    leave CKPT_DIR empty; the set's folder. One rename of the folder: a process killed meanwhile
    leaves the set either all in CKPT_DIR (the next start moves it again) or all aside. Where
    CKPT_DIR cannot be renamed (a mount point), the files move one by one under a hidden name
    that becomes the set's name only once all are there (killed meanwhile: the files not yet
    moved stay in CKPT_DIR, and the next start moves them aside as a set of their own)."""
    real, root = Path(ckpt_dir).resolve(), aside_root(ckpt_dir)
    root.mkdir(parents=True, exist_ok=True)
    step = checkpoint.step_of(checkpoint.list_checkpoints(real)[-1])
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name, n = f"{stamp}-step{step:08d}", 1
    while (root / name).exists():
        n += 1
        name = f"{stamp}-step{step:08d}-{n}"
    dest = root / name
    try:
        real.rename(dest)
        real.mkdir()
    except OSError:  # a mount point, or CKPT_DIR busy: file by file, then one rename
        moving = root / f".{name}.moving"
        moving.mkdir()
        for p in sorted(real.iterdir()):
            shutil.move(p, moving / p.name)
        moving.rename(dest)
    for old in sorted(p for p in root.iterdir() if not p.name.startswith("."))[:-keep]:
        shutil.rmtree(old)  # sets are named by time: the oldest first
        dist.print0(f"removed {old}: more than {keep} sets of checkpoints aside")
    return dest
