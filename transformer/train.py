"""Train the Transformer (§5): Adam with the §5.3 schedule, label smoothing, token-budget batches.

    torchrun --standalone --nproc_per_node=N -m transformer.train SHARDS TOKENIZER CKPT_DIR
    python -m transformer.train SHARDS TOKENIZER CKPT_DIR --live data/live --resume

Settings come from params.yaml (`model`, `train`). Only rank 0 logs and writes checkpoints.
With --resume, a CKPT_DIR holding checkpoints of the same model/tokenizer/shards/batching continues
from the newest one (weights, Adam, schedule, RNG, data position), so a killed run picks up
where it was and ends with the same weights as an uninterrupted one (CPU, same process count;
resume.py). When to log, validate, save and stop: clock.py.

On a GPU an update never waits for the device: batches are copied from pinned memory, token
counts come from the host, the per-update collective runs on the CPU, and the loss stays on the
device until a log, validation or checkpoint point reads it (and rewinds a diverged run there to
its last good checkpoint, or stops it: rewind.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer.core import allocator, dist, failure, settings
from transformer.core.files import sha256_file
from transformer.core.layout import MODEL
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.retrain import RetrainConfig
from transformer.core.sections.train import TrainConfig
from transformer.core.settings import ConfigError
from transformer.data.batches import DataError, PairDataset, load_split
from transformer.data.vocab import TokenizerError, load_tokenizer, tokenizer_sha256
from transformer.model import checkpoint
from transformer.model.checkpoint import CheckpointError
from transformer.model.precision import resolve_precision
from transformer.model.translator import DecodeError
from transformer.training import graphs, preempt
from transformer.training.continuation import (
    Continuation,
    ParentError,
    continuation,
    continued_train_config,
    start_from_parent,
)
from transformer.training.learner import Learner
from transformer.training.loop import Loop
from transformer.training.losses import NonFiniteLoss
from transformer.training.resume import load_resume
from transformer.training.validation import ValidBleu, ValidText, load_valid_text


def rate(
    step: int,
    cfg: TrainConfig,
    d_model: int,
    progress: float = 0.0,
    continued: Continuation | None = None,
) -> float:
    """§5.3: lr = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), times lr_scale and decay;
    a continued retrain's: its parent's schedule continued (parent.Continuation)."""
    if continued is not None:
        lr = continued.rate(step, d_model)
    else:
        lr = cfg.lr_scale * d_model**-0.5 * min(step**-0.5, step * cfg.warmup_steps**-1.5)
    p = min(max(progress, 0.0), 1.0)  # fraction of max_steps / time budget used
    if cfg.lr_decay == "linear":
        lr *= 1.0 - p
    elif cfg.lr_decay == "cosine":
        lr *= 0.5 * (1.0 + math.cos(math.pi * p))
    return lr


def update_path(tcfg: TrainConfig, device: torch.device, precision: str) -> dict[str, bool]:
    """static / graphs / compile, the settings' `auto` resolved: static-shape batches and their
    capture on CUDA (one process, not fp16), a compiled loss only when asked for."""
    cuda = device.type == "cuda"
    static = tcfg.static_shapes == "on" or (tcfg.static_shapes == "auto" and cuda)
    graphs = tcfg.graphs == "auto" and cuda and static
    if graphs and (dist.is_dist() or precision == "fp16"):  # docs/training.md says why
        why = "several processes (DDP)" if dist.is_dist() else "fp16's GradScaler"
        dist.print0(f"train.graphs auto: eager update, as {why} is not captured")
        graphs = False
    if tcfg.compile and dist.is_dist():
        dist.print0("train.compile: not with several processes (DDP); the loss runs eagerly")
    return {"static": static, "graphs": graphs, "compile": tcfg.compile and not dist.is_dist()}


def output_ids(mcfg: ModelConfig, vocab: int, *splits: PairDataset) -> torch.Tensor | None:
    """The units the softmax spans with model.output_vocab target: those the splits' targets use.

    Pass valid with train: a valid target outside the set would have probability 0."""
    if mcfg.output_vocab != "target":
        return None
    ids = torch.from_numpy(np.flatnonzero(sum(s.target_counts(vocab) for s in splits)))
    dist.print0(f"output vocabulary: {len(ids)} of {vocab} units (those of the targets)")
    return ids


@dataclasses.dataclass(frozen=True)
class Data:
    """The run's data: the tokenizer's size and sha256, the train and valid shards, and the
    softmax's units (None: the whole vocabulary)."""

    vocab: int
    sha: str
    train: PairDataset
    valid: PairDataset
    ids: torch.Tensor | None


def load_data(shards_dir: Path, tokenizer_dir: Path, mcfg: ModelConfig) -> Data:
    vocab, sha = load_tokenizer(tokenizer_dir).size, tokenizer_sha256(tokenizer_dir)
    train_set = load_split(shards_dir, "train", sha)
    valid_set = load_split(shards_dir, "valid", sha)
    # with model.output_vocab target the softmax's units come from the valid targets too
    return Data(vocab, sha, train_set, valid_set, output_ids(mcfg, vocab, train_set, valid_set))


def set_up(tcfg: TrainConfig, device: torch.device) -> str:
    """This process's threads; the run's precision, resolved (fp16 only on CUDA)."""
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    if tcfg.precision == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision fp16 needs CUDA (use auto or fp32 on CPU)")
    return resolve_precision(tcfg.precision, device, "train.precision")


def run_meta(
    mcfg: ModelConfig,
    tcfg: TrainConfig,
    data: Data,
    precision: str,
    parent: Path | None,
    continued: Continuation | None,
) -> dict[str, Any]:
    """What a checkpoint must match for --resume to go on from it (resume.py), and records."""
    return {
        "model_config": dataclasses.asdict(mcfg),
        "vocab_size": data.vocab,
        "world_size": dist.world_size(),
        "tokenizer_sha256": data.sha,
        # as resolved: `auto` is bf16 on one host and fp32 on another, and a resume must not
        # switch silently (a differing train_config starts afresh, saying so)
        "train_config": {**dataclasses.asdict(tcfg), "precision": precision},
        # The train shards' sha256s: with the same tokenizer they still change with
        # shard.max_len or a re-run of BPE-dropout, and a resume on other pairs is not the run
        # params.yaml describes.
        "train_shards": [s["sha256"] for s in data.train.index["shards"]],
        "output_ids": None if data.ids is None else data.ids.tolist(),
        "parent_sha256": sha256_file(Path(parent) / MODEL) if parent else None,
        "continued": dataclasses.asdict(continued) if continued else None,  # its rate schedule
    }


def make_learner(
    mcfg: ModelConfig,
    tcfg: TrainConfig,
    data: Data,
    device: torch.device,
    precision: str,
    ckpt_dir: Path,
) -> Learner:
    """The update on the path update_path resolves; a captured one runs eagerly the batch shapes
    whose replay failed before (graphs.py: None, every shape)."""
    path = update_path(tcfg, device, precision)
    eager = graphs.failed_before(ckpt_dir) if path["graphs"] else set()  # a failed replay's
    path["graphs"] &= eager is not None
    learner = Learner(mcfg, tcfg, data.vocab, data.ids, device, precision, **path)
    if learner.graphs is not None:
        learner.graphs.eager |= eager
    return learner


def train(
    shards_dir: Path,
    tokenizer_dir: Path,
    ckpt_dir: Path,
    mcfg: ModelConfig,
    tcfg: TrainConfig,
    live_dir: Path | None = None,
    resume: bool = False,
    progress_bar: bool = True,
    parent: Path | None = None,
    continued: Continuation | None = None,
    valid_text: ValidText | None = None,
) -> dict[str, Any]:
    """Train to max_steps / the time budget (or early stopping), from the weights of the package
    folder `parent` where given (a continued retrain, at the rate `continued`), scoring BLEU on
    `valid_text` at validation points; returns the final step, seconds and metrics."""
    allocator.keep_freed_memory()
    rank, _, device = dist.init()
    precision = set_up(tcfg, device)
    data = load_data(shards_dir, tokenizer_dir, mcfg)
    meta = run_meta(mcfg, tcfg, data, precision, parent, continued)
    ckpt, ckpt_path = load_resume(ckpt_dir, meta, resume)
    torch.manual_seed(tcfg.seed)  # the same initial weights on every rank
    learner = make_learner(mcfg, tcfg, data, device, precision, ckpt_dir)
    if ckpt is None and parent is not None:  # a fresh continuation: the parent's weights
        start_from_parent(learner.model, parent, data.sha, continued, mcfg.d_model)
    torch.manual_seed(tcfg.seed * 1000 + rank)  # a fresh run: its own dropout stream per rank
    bleu = ValidBleu(valid_text, tokenizer_dir, device) if valid_text else None
    loop = Loop(
        learner, tcfg, data, meta, (ckpt, ckpt_path), ckpt_dir, bleu, live_dir, progress_bar
    )
    del ckpt  # its tensors freed: the loop holds what it restored from them
    while not loop.clock.stop:
        step = loop.next_update()
        lr = rate(step, tcfg, mcfg.d_model, loop.clock.progress(step - 1), continued)
        loop.update(lr * loop.rewinder.factor(step))  # lowered for a while after a rewind
        if not loop.at_point():
            continue  # nothing read back: on a GPU the host runs ahead to the next update
        if loop.rewound():
            continue  # diverged: back at its last good checkpoint, past the diverged batches
        loop.log_and_save()
        if loop.notice.stopped:
            break  # preempted: this update is saved, and --resume goes on from it
    return loop.finish()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shards", type=Path, help="shard directory (train/ and valid/ inside)")
    parser.add_argument("tokenizer", type=Path, help="tokenizer directory")
    parser.add_argument("ckpt_dir", type=Path, help="where step_XXXXXXXX.pt files are written")
    parser.add_argument("--live", type=Path, help="dvclive directory (metrics and plots)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint of the same config in ckpt_dir "
        "(without it, or when the config differs, the checkpoints already "
        "in ckpt_dir are moved aside, whole, to CKPT_DIR.aside/ and training starts fresh)",
    )
    parser.add_argument(
        "--parent",
        type=Path,
        help="the parent package folder: with retrain.mode continue training starts from its "
        "weights, for retrain.continuation's steps and rate schedule",
    )
    parser.add_argument(
        "--raw",
        type=Path,
        help="raw split folder (valid.{src,tgt}): valid BLEU/chrF at validation points",
    )
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        mcfg = settings.load(ModelConfig, "model", args.params)
        tcfg = settings.load(TrainConfig, "train", args.params)
        rcfg = settings.load(RetrainConfig, "retrain", args.params)
        parent = args.parent if rcfg.mode == "continue" and args.parent else None
        continued = None
        if parent is not None:
            continued = continuation(parent, rcfg.continuation, tcfg)
            tcfg = continued_train_config(tcfg, rcfg.continuation)
        use_raw = args.raw and tcfg.valid_bleu
        valid_text = load_valid_text(args.raw, tcfg, args.params) if use_raw else None
        out = preempt.handled(train)(  # with the notice's signals handled
            args.shards,
            args.tokenizer,
            args.ckpt_dir,
            mcfg,
            tcfg,
            args.live,
            args.resume,
            not args.no_progress,
            parent,
            continued,
            valid_text,
        )
        if out["preempted"]:  # every rank saved this step
            dist.print0(f"preempted at step {out['step']}: --resume continues from it")
            sys.exit(preempt.PREEMPTED)
        dist.print0(f"done: step {out['step']}, {out['train_seconds']:.0f} s")
    except (
        ConfigError,
        CheckpointError,
        NonFiniteLoss,
        DataError,
        TokenizerError,
        ParentError,
        DecodeError,
        OSError,
    ) as e:
        sys.exit(f"error: {e}")
    except graphs.ReplayFailed as e:  # nothing saved: the CUDA context may be unusable
        eager = graphs.record_failure(args.ckpt_dir, e.key)
        dist.print0(f"{e}\nexiting {graphs.REPLAY_FAILED}: the resumed run runs {eager} eagerly")
        sys.exit(graphs.REPLAY_FAILED)
    except KeyboardInterrupt:
        last = checkpoint.list_checkpoints(args.ckpt_dir)
        where = f"--resume continues from {last[-1]}" if last else "no checkpoint yet"
        dist.print0(f"interrupted; {where}")
        sys.exit(130)
    finally:
        dist.destroy()


if __name__ == "__main__":
    # as a program (torchrun's rank, the launcher's process), not when main() is called in a
    # process whose stderr may have no file: a rank killed by a fatal signal (a C++ abort, a
    # segfault) prints each thread's Python stack, where torchrun's summary names the signal
    faulthandler.enable()
    dist.run(failure.recorded("train", main))
