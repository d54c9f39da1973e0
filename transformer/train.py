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
import contextlib
import dataclasses
import faulthandler
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer.core import allocator, dist, failure, hardware, settings
from transformer.core.files import sha256_file
from transformer.core.layout import MODEL
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.retrain import RetrainConfig
from transformer.core.sections.train import TrainConfig
from transformer.core.settings import ConfigError
from transformer.data.batches import BatchSampler, DataError, PairDataset, collate, load_split
from transformer.data.vocab import TokenizerError, load_tokenizer, tokenizer_sha256
from transformer.model import checkpoint
from transformer.model.checkpoint import CheckpointError
from transformer.model.precision import resolve_precision
from transformer.model.translator import DecodeError
from transformer.training import ema, graphs, preempt
from transformer.training.clock import Clock
from transformer.training.continuation import (
    Continuation,
    ParentError,
    continuation,
    continued_train_config,
    load_parent,
)
from transformer.training.learner import Learner, n_targets
from transformer.training.losses import LossSums, NonFiniteLoss
from transformer.training.report import Report
from transformer.training.resume import (
    load_resume,
    make_checkpoint,
    restore,
    started_from,
    write_checkpoint,
)
from transformer.training.rewind import Rewinder
from transformer.training.selection import STATE, Selection
from transformer.training.validation import ValidBleu, ValidText, load_valid_text, validate

RUN_ENV = "TRANSFORMER_RUN"  # the experiment a flow runs the stage for (flows/pipeline.py)


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


def batch_stream(dataset, sampler) -> Iterator[tuple[dict[str, int], Any]]:
    """(sampler position after this batch, collated batch) forever, epoch after epoch."""
    while True:  # the sampler continues from its position and rolls over into the next epoch
        for idx in sampler:
            yield sampler.state_dict(), collate([dataset[j] for j in idx], sampler.shape)


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
    rank, world, device = dist.init()
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    if tcfg.precision == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision fp16 needs CUDA (use auto or fp32 on CPU)")
    precision = resolve_precision(tcfg.precision, device, "train.precision")
    vocab, sha = load_tokenizer(tokenizer_dir).size, tokenizer_sha256(tokenizer_dir)
    train_set = load_split(shards_dir, "train", sha)
    valid_set = load_split(shards_dir, "valid", sha)
    # The train shards' sha256s: with the same tokenizer they still change with shard.max_len or
    # a re-run of BPE-dropout, and a resume on other pairs is not the run params.yaml describes.
    # With model.output_vocab target the softmax's units come from the valid targets too.
    ids = output_ids(mcfg, vocab, train_set, valid_set)
    meta = {
        "model_config": dataclasses.asdict(mcfg),
        "vocab_size": vocab,
        "world_size": world,
        "tokenizer_sha256": sha,
        # as resolved: `auto` is bf16 on one host and fp32 on another, and a resume must not
        # switch silently (a differing train_config starts afresh, saying so)
        "train_config": {**dataclasses.asdict(tcfg), "precision": precision},
        "train_shards": [s["sha256"] for s in train_set.index["shards"]],
        "output_ids": None if ids is None else ids.tolist(),
        "parent_sha256": sha256_file(Path(parent) / MODEL) if parent else None,
        "continued": dataclasses.asdict(continued) if continued else None,  # its rate schedule
    }

    ckpt, ckpt_path = load_resume(ckpt_dir, meta, resume)
    torch.manual_seed(tcfg.seed)  # the same initial weights on every rank
    path = update_path(tcfg, device, precision)
    eager = graphs.failed_before(ckpt_dir) if path["graphs"] else set()  # a failed replay's
    path["graphs"] &= eager is not None  # (None: every shape)
    learner = Learner(mcfg, tcfg, vocab, ids, device, precision, **path)
    if learner.graphs is not None:
        learner.graphs.eager |= eager
    model, opt, scaler = learner.model, learner.opt, learner.scaler
    if ckpt is None and parent is not None:  # a fresh continuation: the parent's weights
        init, init_path = load_parent(parent, sha)
        checkpoint.load_weights(model, init, init_path)
        dist.print0(
            f"continuing from {init_path} (trained {init['step']} steps, "
            f"{continued.updates if continued else init['step']} with its ancestors')"
            + (
                f": its last rate {continued.last_rate(mcfg.d_model):.3g} x "
                f"{continued.lr_factor}, reached over {continued.rewarmup_steps} updates"
                if continued
                else ""
            )
        )
        del init
    torch.manual_seed(tcfg.seed * 1000 + rank)  # a fresh run: its own dropout stream per rank
    sampler = BatchSampler(
        train_set.src_lens,
        train_set.tgt_lens,
        tcfg.max_tokens,
        tcfg.seed,
        rank=rank,
        world_size=world,
        static=path["static"],
        group=tcfg.update_freq,
    )
    batching = {f"train/{k}": x for k, x in sampler.stats.items()}
    step, seconds = restore(ckpt, ckpt_path, learner, sampler) if ckpt else (0, 0.0)
    run = os.environ.get(RUN_ENV)  # the flows name the run; checkpoints record it, not meta
    origin = started_from(ckpt, run)
    ema_avg = ema.start(model, tcfg.ema_decay, ckpt, ckpt_path)  # None with ema_decay 0
    # what validation scores: the EMA's weights when it is on (in and out by learner.load_state)
    on_ema = (lambda: ema_avg.swapped(learner.load_state)) if ema_avg else contextlib.nullcontext
    clock = Clock(tcfg, step, seconds, finished=bool(ckpt and ckpt.get("final", True)))
    select = Selection(tcfg, bleu=valid_text is not None)  # best checkpoints, early stopping
    select.load_state_dict(ckpt.get(STATE) if ckpt else None)
    clock.stop |= select.stopped  # resumed where patience ran out: nothing left to train
    bleu = ValidBleu(valid_text, tokenizer_dir, device) if valid_text else None
    rewinder = Rewinder(tcfg, ckpt_dir, learner, sampler, ckpt.get("rewind") if ckpt else None)
    del ckpt  # (checkpoints from before the `final` flag: the last of their run)
    stream = batch_stream(train_set, sampler)
    alone_on_cpu = device.type == "cpu" and world == 1
    report = Report(live_dir, step, tcfg.max_steps, progress_bar, cpu=alone_on_cpu, origin=origin)
    losses = LossSums(learner.sums, step)
    notice = preempt.Notice()  # SIGTERM / SIGUSR1 (main): save the update in progress, stop
    model.train()
    while not clock.stop:
        step += 1
        batches = [next(stream) for _ in range(tcfg.update_freq)]
        pos = batches[-1][0]  # the data position after this update, for the checkpoint
        n_tokens = clock.tick(step, sum(n_targets(b) for _, b in batches))
        lr = rate(step, tcfg, mcfg.d_model, clock.progress(step - 1), continued)
        lr *= rewinder.factor(step)  # lowered for a while after a rewind
        learner.step([b for _, b in batches], n_tokens, lr)  # its loss sums: into losses.sums
        rewinder.inject(step)  # train.inject_divergence_at, a test hook (as the update did it)
        if ema_avg:
            ema_avg.update()
        losses.add(n_tokens)
        report.bar.update(1)

        logging, validating = clock.should_log(step), clock.should_validate(step)
        saving = notice.agreed() or clock.should_save(step)
        if not (logging or validating or saving):
            continue  # nothing read back: on a GPU the host runs ahead to the next update
        if (back := rewinder.read(losses, step, pos)) is not None:  # diverged: rewound
            step, stream = back, batch_stream(train_set, sampler)  # past the diverged batches
            losses = LossSums(learner.sums, back)
            select.load_state_dict(rewinder.restored.get(STATE))  # its best list and patience
            if ema_avg:  # its average too: the diverged updates reached it
                ema_avg.load_state_dict(rewinder.restored[ema.KEY])
            clock.stop = False  # (if it diverged at the last step)
            report.rewound(back)
            continue
        logged = {}
        if logging:
            logged = {**report.train_metrics(losses.take(), lr, clock.seconds()), **batching}
            logged.update(rewinder.metrics() | learner.metrics())
        if validating:
            with on_ema():  # the EMA's scores when it is on
                v = validate(model, valid_set, tcfg, device, learner.autocast)
                v.update(bleu(model) if bleu else {})
            logged.update({f"valid/{k}": x for k, x in v.items()})
            saving |= select.update(step, v)  # a new best: its checkpoint is kept
            clock.stop |= select.stopped
            saving |= clock.stop
            report.pause()
        report.log(step, logged)
        seconds = clock.seconds()
        if saving:
            ckpt = make_checkpoint(model, opt, scaler, meta, step, seconds, pos, clock.stop)
            if ckpt is not None:
                ckpt.update(run=run, origin=origin, rewind=rewinder.state_dict())
                ckpt[hardware.KEY] = learner.trained_on()  # where and how, to the package
                ckpt[STATE] = select.state_dict()
                ema.add_to(ckpt, ema_avg)
                path = write_checkpoint(ckpt_dir, ckpt, tcfg.keep_last, select.best_steps())
                report.bar.write(f"step {step}: saved {path}")
            clock.saved()
        if notice.stopped:
            break
    # nothing trained (the run was already done) and its curves gone (a clone that pulled the
    # checkpoints only): log where it stands, so that the stage's metrics and plots exist again.
    # Rank 0 decides: every rank must join validate's all-reduce, or none.
    if (
        not report.metrics
        and not notice.stopped
        and dist.broadcast_object(
            report.live is not None and not any(Path(live_dir, "plots").rglob("*.tsv"))
        )
    ):
        with on_ema():
            v = validate(model, valid_set, tcfg, device, learner.autocast)
        report.log(step, {f"valid/{k}": x for k, x in v.items()})
    # why it stopped, the best (a preempted run has not stopped: it resumes)
    outcome = {} if notice.stopped else select.summary(step, tcfg.max_steps, seconds)
    if report.live is not None:
        report.live.summary.update({**outcome, hardware.KEY: learner.trained_on()})
    report.close()
    return {
        "step": step,
        "train_seconds": seconds,
        "preempted": notice.stopped,
        **report.metrics,
        **outcome,
    }


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
