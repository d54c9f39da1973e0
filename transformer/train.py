"""Train the Transformer (§5): Adam with the §5.3 schedule, label smoothing, token-budget batches.

    torchrun --standalone --nproc_per_node=N -m transformer.train SHARDS TOKENIZER CKPT_DIR
    python -m transformer.train SHARDS TOKENIZER CKPT_DIR --live data/live --resume

Settings come from params.yaml (`model`, `train`). Only rank 0 logs and writes checkpoints.
With --resume, a CKPT_DIR holding checkpoints of the same model/tokenizer/shards/batching continues
from the newest one (weights, Adam, schedule, RNG, data position), so a killed run picks up
where it was and ends with the same weights as an uninterrupted one (CPU, same process count).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from transformer import allocator, checkpoint, config, dist
from transformer.checkpoint import CheckpointError
from transformer.config import ConfigError, ModelConfig, TrainConfig
from transformer.cpu_share import CpuShare
from transformer.data import BatchSampler, DataError, PairDataset, collate, load_split
from transformer.files import remove_partial_writes
from transformer.model import Transformer
from transformer.precision import resolve_precision
from transformer.tokenizer import PAD_ID, TokenizerError, load_tokenizer, tokenizer_sha256

# train_config keys that do not change the weights up to a checkpoint: a checkpoint differing
# only in these is resumed; any other difference (rate, batching, precision, ...) starts afresh,
# so that the result is always what a fresh run with today's params.yaml would give.
RESUME_FREE_KEYS = frozenset({"max_steps", "time_budget_minutes", "valid_every_steps",
                              "log_every_steps", "threads", "keep_last", "save_every_steps",
                              "save_every_minutes"})


class NonFiniteLoss(RuntimeError):
    pass


def rate(step: int, cfg: TrainConfig, d_model: int, progress: float = 0.0) -> float:
    """§5.3: lr = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), times lr_scale and decay."""
    lr = cfg.lr_scale * d_model**-0.5 * min(step**-0.5, step * cfg.warmup_steps**-1.5)
    p = min(max(progress, 0.0), 1.0)  # fraction of max_steps / time budget used
    if cfg.lr_decay == "linear":
        lr *= 1.0 - p
    elif cfg.lr_decay == "cosine":
        lr *= 0.5 * (1.0 + math.cos(math.pi * p))
    return lr


class WithLoss(nn.Module):
    """The model with its loss as forward(), so that DDP hooks the whole training computation."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src, tgt_in, tgt_out, eps: float):
        return self.model.loss(src, tgt_in, tgt_out, eps)


def batch_stream(dataset, sampler) -> Iterator[tuple[dict[str, int], Any]]:
    """(sampler position after this batch, collated batch) forever, epoch after epoch."""
    while True:  # the sampler continues from its position and rolls over into the next epoch
        for idx in sampler:
            yield sampler.state_dict(), collate([dataset[j] for j in idx])


def progress_of(step: int, seconds: float, cfg: TrainConfig) -> float:
    """How far through the run: the larger of steps/max_steps and seconds/budget."""
    p = step / cfg.max_steps if cfg.max_steps > 0 else 0.0
    if cfg.time_budget_minutes > 0:
        p = max(p, seconds / (60.0 * cfg.time_budget_minutes))
    return p


@torch.no_grad()
def evaluate(model: Transformer, dataset, cfg: TrainConfig, device, autocast) -> dict[str, float]:
    """Label-smoothed loss, NLL and perplexity per target token on a split, summed over ranks."""
    model.eval()
    sampler = BatchSampler(dataset.src_lens, dataset.tgt_lens, cfg.max_tokens, cfg.seed,
                           shuffle=False)
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for idx in list(sampler)[dist.rank() :: dist.world_size()]:  # each rank a disjoint share
        b = collate([dataset[j] for j in idx])
        tgt_out = b.tgt_out.to(device)
        with autocast():
            loss, nll = model.loss(b.src.to(device), b.tgt_in.to(device), tgt_out,
                                   cfg.label_smoothing)
        sums += torch.stack([loss.double(), nll.double(), tgt_out.ne(PAD_ID).sum().double()])
    loss, nll, n = dist.all_reduce_sum(sums).tolist()
    model.train()
    n = max(n, 1.0)
    return {"loss": loss / n, "nll": nll / n, "ppl": math.exp(min(nll / n, 50.0))}


def find_resume(ckpt_dir: Path, meta: dict[str, Any]) -> tuple[Path | None, str]:
    """(newest checkpoint to continue from, or None, and why not)."""
    paths = checkpoint.list_checkpoints(ckpt_dir)
    if not paths:
        return None, "no checkpoint"
    ckpt = checkpoint.load(paths[-1])
    for key, want in meta.items():
        have = ckpt.get(key)
        if key == "train_config" and isinstance(have, dict):
            # with a decay, max_steps / the budget shape the rate from the first step on
            free = RESUME_FREE_KEYS if want["lr_decay"] == "none" else RESUME_FREE_KEYS - {
                "max_steps", "time_budget_minutes"}
            have = {k: v for k, v in have.items() if k not in free}
            want = {k: v for k, v in want.items() if k not in free}
        if have != want:
            keys = sorted(k for k in want if have.get(k) != want[k]) if (
                isinstance(have, dict) and isinstance(want, dict)) else []
            return None, f"{paths[-1]}: {key} differs" + (f" {keys}" if keys else "")
    max_steps = meta["train_config"]["max_steps"]
    if 0 < max_steps < ckpt["step"]:  # fewer steps than done: only a fresh run gives that model
        return None, f"{paths[-1]}: step {ckpt['step']} is past train.max_steps {max_steps}"
    budget, seconds = meta["train_config"]["time_budget_minutes"], ckpt.get("train_seconds", 0.0)
    before = (ckpt.get("train_config") or {}).get("time_budget_minutes") or 0.0
    if 0 < budget < (before or float("inf")) and 60 * budget < seconds:
        # a budget lowered below the time trained: a fresh run would stop sooner. (A finished
        # run's last checkpoint is always a little past its own budget: that is not lowered.)
        return None, (f"{paths[-1]}: {seconds:.0f} s of training are past the lowered "
                      f"train.time_budget_minutes {budget:g}")
    if "optimizer" not in ckpt:
        return None, f"{paths[-1]}: not a training checkpoint (no optimizer state)"
    return paths[-1], ""


def make_checkpoint(model, opt, scaler, meta, step, seconds, data,
                    final: bool) -> dict[str, Any] | None:
    """The checkpoint dict on rank 0 (None elsewhere); every rank must call it (RNG gather)."""
    rng = {"torch": torch.get_rng_state(),
           "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}
    rngs = dist.all_gather_object(rng)  # every rank's dropout stream, for an exact resume
    if not dist.is_main():
        return None
    return {**meta, "model": model.state_dict(), "step": step, "train_seconds": seconds,
            "final": final,  # the run's last: a resume at the same budget trains nothing
            "optimizer": opt.state_dict(), "scheduler": {"step": step},
            "scaler": scaler.state_dict() if scaler.is_enabled() else None,
            "rng": rngs, "data": data}


def write_checkpoint(ckpt_dir: Path, ckpt: dict[str, Any], keep_last: int) -> Path:
    path = checkpoint.step_path(ckpt_dir, ckpt["step"])
    checkpoint.save(path, ckpt)
    if keep_last > 0:  # the last K kept (§6.1 averages the last 5 or 20)
        for old in checkpoint.list_checkpoints(ckpt_dir)[:-keep_last]:
            old.unlink(missing_ok=True)
    return path


def restore(ckpt: dict[str, Any], path: str, model, opt, scaler, sampler) -> tuple[int, float]:
    """Load weights, Adam, scaler, data position and this rank's RNG; (step, seconds)."""
    checkpoint.load_weights(model, ckpt, path)
    opt.load_state_dict(ckpt["optimizer"])
    if scaler.is_enabled() and ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    rng = ckpt["rng"][dist.rank()]
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    sampler.load_state_dict(ckpt["data"])
    return int(ckpt["step"]), float(ckpt["train_seconds"])


def load_resume(ckpt_dir: Path, meta: dict[str, Any], resume: bool
                ) -> tuple[dict[str, Any] | None, str]:
    """(checkpoint, its path), or (None, ""): rank 0 picks it; every rank gets it (from disk, or
    broadcast if not shared). Only rank 0 looks: another rank could list a stale checkpoint as
    rank 0 removes it."""
    path = None
    if dist.is_main():
        path, why = (find_resume(ckpt_dir, meta) if resume else (None, "--resume not given"))
        remove_partial_writes(ckpt_dir, "step_*.pt")  # of a process killed while it saved
        stale = checkpoint.list_checkpoints(ckpt_dir)
        if path is None and stale:  # a fresh run: older checkpoints would mix into averaging
            dist.print0(f"starting fresh ({why}): removing {len(stale)} old checkpoint(s)")
            for p in stale:
                p.unlink()
    path = dist.broadcast_object(str(path) if path else None)
    if path is None:
        return None, ""
    visible = all(dist.all_gather_object(Path(path).is_file()))
    ckpt = checkpoint.load(Path(path)) if visible or dist.is_main() else None
    ckpt = ckpt if visible else dist.broadcast_object(ckpt)
    dist.print0(f"resuming from {path} (step {ckpt['step']})")
    return ckpt, path


def open_live(live_dir: Path | None, resumed_step: int):
    """dvclive on rank 0; on resume, rows logged after the checkpoint are dropped (redone)."""
    if live_dir is None or not dist.is_main():
        return None
    from dvclive import Live

    if resumed_step:
        for tsv in Path(live_dir, "plots", "metrics").rglob("*.tsv"):
            lines = tsv.read_text().splitlines(keepends=True)
            col = lines[0].rstrip("\n").split("\t").index("step") if lines else 0
            keep = lines[:1] + [ln for ln in lines[1:] if int(ln.split("\t")[col]) <= resumed_step]
            tsv.write_text("".join(keep))
    return Live(str(live_dir), resume=bool(resumed_step), save_dvc_exp=False, dvcyaml=None)


def output_ids(mcfg: ModelConfig, vocab: int, *splits: PairDataset) -> torch.Tensor | None:
    """The units the softmax spans with model.output_vocab target: those the splits' targets use.

    Pass valid with train: a valid target outside the set would have probability 0."""
    if mcfg.output_vocab != "target":
        return None
    ids = torch.from_numpy(np.flatnonzero(sum(s.target_counts(vocab) for s in splits)))
    dist.print0(f"output vocabulary: {len(ids)} of {vocab} units (those of the targets)")
    return ids


def train(shards_dir: Path, tokenizer_dir: Path, ckpt_dir: Path, mcfg: ModelConfig,
          tcfg: TrainConfig, live_dir: Path | None = None, resume: bool = False,
          progress_bar: bool = True) -> dict[str, Any]:
    """Train to max_steps / the time budget; returns the final step, seconds and metrics."""
    allocator.keep_freed_memory()
    rank, world, device = dist.init()
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    if tcfg.precision == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision fp16 needs CUDA (use auto or fp32 on CPU)")
    precision = resolve_precision(tcfg.precision, device, "train.precision")
    vocab, sha = load_tokenizer(tokenizer_dir).get_vocab_size(), tokenizer_sha256(tokenizer_dir)
    train_set = load_split(shards_dir, "train", sha)
    valid_set = load_split(shards_dir, "valid", sha)
    # The train shards' sha256s: with the same tokenizer they still change with shard.max_len or
    # a re-run of BPE-dropout, and a resume on other pairs is not the run params.yaml describes.
    # With model.output_vocab target the softmax's units come from the valid targets too.
    ids = output_ids(mcfg, vocab, train_set, valid_set)
    meta = {"model_config": dataclasses.asdict(mcfg), "vocab_size": vocab, "world_size": world,
            "tokenizer_sha256": sha, "train_config": dataclasses.asdict(tcfg),
            "train_shards": [s["sha256"] for s in train_set.index["shards"]],
            "output_ids": None if ids is None else ids.tolist()}

    torch.manual_seed(tcfg.seed)  # the same initial weights on every rank
    model = Transformer(mcfg, vocab, ids).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.0, betas=tuple(tcfg.adam_betas),
                           eps=tcfg.adam_eps, fused=tcfg.fused_adam or None)  # §5.3
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    dist.print0(f"training in {precision} on {device}")

    def autocast() -> torch.autocast:  # bf16 (CPU, CUDA) / fp16 (CUDA); master weights stay fp32
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    ckpt, ckpt_path = load_resume(ckpt_dir, meta, resume)
    torch.manual_seed(tcfg.seed * 1000 + rank)  # a fresh run: its own dropout stream per rank
    sampler = BatchSampler(train_set.src_lens, train_set.tgt_lens, tcfg.max_tokens, tcfg.seed,
                           rank=rank, world_size=world)
    step, seconds = restore(ckpt, ckpt_path, model, opt, scaler, sampler) if ckpt else (0, 0.0)
    finished = bool(ckpt and ckpt.get("final", True))  # checkpoints before the flag: the last
    del ckpt
    stream = batch_stream(train_set, sampler)
    ddp = dist.wrap(WithLoss(model), device)
    live = open_live(live_dir, step)
    max_steps = tcfg.max_steps if tcfg.max_steps > 0 else sys.maxsize
    if finished and 0 < 60 * tcfg.time_budget_minutes <= seconds:
        max_steps = step  # resumed at this budget's last checkpoint: nothing left to train
    # (a periodic checkpoint past the budget: the run went on to one more step, the final one;
    # so does its resume, whose first step finds the budget spent)
    bar = tqdm(total=tcfg.max_steps or None, initial=step, disable=not (progress_bar and rank == 0),
               unit="step", dynamic_ncols=True)
    cpu = CpuShare() if device.type == "cpu" and world == 1 else None
    t_start, t_saved, t_log = time.monotonic(), time.monotonic(), time.monotonic()
    base_seconds, log = seconds, torch.zeros(3, dtype=torch.float64)  # loss, nll, tokens
    metrics: dict[str, float] = {}
    model.train()
    while step < max_steps:
        step += 1
        seconds = base_seconds + time.monotonic() - t_start
        lr = rate(step, tcfg, mcfg.d_model, progress_of(step - 1, seconds, tcfg))
        for g in opt.param_groups:
            g["lr"] = lr
        batches = [next(stream) for _ in range(tcfg.update_freq)]
        pos = batches[-1][0]  # the data position after this update, for the checkpoint
        # one collective for the update's target tokens (all ranks and micro-batches, so that
        # the loss is normalised per token of the whole update) and rank 0's clock decisions
        now = time.monotonic()
        ctl = torch.tensor([sum(int(b.tgt_out.ne(PAD_ID).sum()) for _, b in batches),
                            float(rank == 0 and tcfg.save_every_minutes > 0
                                  and now - t_saved >= 60 * tcfg.save_every_minutes),
                            float(rank == 0 and tcfg.time_budget_minutes > 0
                                  and seconds >= 60 * tcfg.time_budget_minutes)],
                           dtype=torch.float64, device=device)
        n_tokens, save_clock, out_of_time = dist.all_reduce_sum(ctl).tolist()
        sums = torch.zeros(2, dtype=torch.float64, device=device)
        for i, (_, b) in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or world == 1 else ddp.no_sync()
            with sync:  # DDP all-reduces gradients once, on the update's last micro-batch
                with autocast():
                    loss, nll = ddp(b.src.to(device), b.tgt_in.to(device), b.tgt_out.to(device),
                                    tcfg.label_smoothing)
                # DDP averages over ranks: x world / n_tokens gives the per-token mean gradient
                scaler.scale(loss * (world / n_tokens)).backward()
            sums += torch.stack([loss.detach().double(), nll.detach().double()])
        if tcfg.clip_norm > 0:
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), tcfg.clip_norm)
        loss_sum, nll_sum = dist.all_reduce_sum(sums).tolist()
        if not math.isfinite(loss_sum):  # every rank sees the same sum: all stop together
            raise NonFiniteLoss(f"non-finite loss ({loss_sum}) at step {step}; stopping before "
                                f"any checkpoint of it is written")
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        log += torch.tensor([loss_sum, nll_sum, n_tokens], dtype=torch.float64)
        bar.update(1)

        final = step >= max_steps or out_of_time > 0
        logged: dict[str, float] = {}
        if step % max(tcfg.log_every_steps, 1) == 0 or final:
            dt, t_log = time.monotonic() - t_log, time.monotonic()
            logged.update({"train/loss": log[0].item() / log[2].item(),
                            "train/nll": log[1].item() / log[2].item(), "train/lr": lr,
                            "train/tokens_per_s": log[2].item() / dt,
                            "train/seconds": base_seconds + time.monotonic() - t_start})
            log.zero_()
            if cpu is not None:  # a shared CPU explains a slow run: logged, and warned of
                share = cpu.sample()
                logged.update({f"train/cpu_{k}": x for k, x in share.items()})
                if (warning := cpu.warning(share)) is not None:
                    bar.write(warning)
            bar.set_postfix(loss=f"{logged['train/loss']:.3f}", lr=f"{lr:.2e}",
                            tok_s=f"{logged['train/tokens_per_s']:.0f}")
        if (tcfg.valid_every_steps > 0 and step % tcfg.valid_every_steps == 0) or final:
            v = evaluate(model, valid_set, tcfg, device, autocast)
            logged.update({f"valid/{k}": x for k, x in v.items()})
            t_log = time.monotonic()  # validation time is not training throughput
        metrics.update(logged)
        if live is not None and logged:
            live.step = step
            for k, x in logged.items():
                live.log_metric(k, x)
            live.next_step()
        seconds = base_seconds + time.monotonic() - t_start
        if final or save_clock > 0 or (tcfg.save_every_steps > 0
                                       and step % tcfg.save_every_steps == 0):
            ckpt = make_checkpoint(model, opt, scaler, meta, step, seconds, pos, final)
            if ckpt is not None:
                path = write_checkpoint(ckpt_dir, ckpt, tcfg.keep_last)
                bar.write(f"step {step}: saved {path}")
            t_saved = time.monotonic()
        if final:
            break
    bar.close()
    # nothing trained (the run was already done) and its curves gone (a clone that pulled the
    # checkpoints only): log where it stands, so that the stage's metrics and plots exist again.
    # Rank 0 decides: every rank must join evaluate's all-reduce, or none.
    if not metrics and dist.broadcast_object(
            live is not None and not any(Path(live_dir, "plots").rglob("*.tsv"))):
        v = evaluate(model, valid_set, tcfg, device, autocast)
        if live is not None:
            live.step = step
            for k, x in v.items():
                live.log_metric(f"valid/{k}", x)
            live.next_step()
    if live is not None:
        live.end()
    return {"step": step, "train_seconds": seconds, **metrics}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m transformer.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", type=Path, help="shard directory (train/ and valid/ inside)")
    parser.add_argument("tokenizer", type=Path, help="tokenizer directory")
    parser.add_argument("ckpt_dir", type=Path, help="where step_XXXXXXXX.pt files are written")
    parser.add_argument("--live", type=Path, help="dvclive directory (metrics and plots)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint of the same config in ckpt_dir "
                             "(without it, or when the config differs, the checkpoints already "
                             "in ckpt_dir are removed and training starts fresh)")
    parser.add_argument("--params", type=Path, default=config.PARAMS, help="params.yaml")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        mcfg = config.load(ModelConfig, "model", args.params)
        tcfg = config.load(TrainConfig, "train", args.params)
        out = train(args.shards, args.tokenizer, args.ckpt_dir, mcfg, tcfg, args.live,
                    args.resume, not args.no_progress)
        dist.print0(f"done: step {out['step']}, {out['train_seconds']:.0f} s")
    except (ConfigError, CheckpointError, NonFiniteLoss, DataError, TokenizerError, OSError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        last = checkpoint.list_checkpoints(args.ckpt_dir)
        where = f"--resume continues from {last[-1]}" if last else "no checkpoint yet"
        dist.print0(f"interrupted; {where}")
        sys.exit(130)
    finally:
        dist.destroy()


if __name__ == "__main__":
    main()
