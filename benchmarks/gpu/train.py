"""The GPU check's training contenders of ours: the train stage's own update (learner.Learner) on
batches as the train stage makes them, and the train stage itself (`python -m transformer.train`)
on a synthetic corpus for about a minute (benchmarks/gpu/check.py).

Ours's paths: "ours" is what the train stage runs by default on the device (on CUDA static-shape
batches, each shape's update captured as a CUDA graph; on a CPU the eager update);
"ours_eager" the eager update on batches of any shape (the update before static shapes and
graphs); "ours_compiled" ours with the loss under torch.compile (one dynamic-shape compile)
inside the graphs; "ours_unfused_loss" / "ours_torch_dropout" ours with F.linear +
F.cross_entropy / F.dropout.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import ROOT
from benchmarks.gpu import peers
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.train import TrainConfig
from transformer.data.batches import Batch, BatchSampler, load_split
from transformer.model import checkpoint, ops
from transformer.train import update_path
from transformer.training.learner import STATIC, Learner

OURS = ("ours", "ours_eager", "ours_compiled", "ours_unfused_loss", "ours_torch_dropout")
PRIME = 3  # passes over a captured contender's batches before it is timed: 2 eager + capture


def learner(name: str, shape: str, vocab: int, device: torch.device, dtype) -> Learner:
    """A contender's Learner as the train stage builds it, from the same seed."""
    precision = "bf16" if dtype == torch.bfloat16 else "fp32"
    tcfg = TrainConfig(label_smoothing=peers.EPS, precision=precision, fused_adam=True)
    path = update_path(tcfg, device, precision)
    if name == "ours_eager":
        path = {"static": False, "graphs": False, "compile": False}
    path["compile"] = name == "ours_compiled"
    torch.manual_seed(0)
    le = Learner(ModelConfig(**peers.SHAPES[shape]), tcfg, vocab, None, device, precision, **path)
    le.model.fused_loss = name != "ours_unfused_loss"
    return le


def learner_step(le: Learner):
    """peers.measure_steps's step: one update of the train stage on a host batch; its loss."""

    def step(w: peers.Work) -> torch.Tensor:
        le.sums.zero_()
        le.step([Batch(w.src, w.tgt_in, w.tgt_out)], float(w.n_tgt), 1e-4)
        return le.sums[0].clone()

    return step


def contender(name: str, shape: str, size: int, cfg: dict, chk) -> dict:
    """An ours contender's figures at one size, on a Learner of its own (built after the last
    one was freed: its graphs, capture time and peak memory are this size's alone). A captured
    one first runs its static batches PRIME times (the first pass, eager on shapes new to the
    process, timed as its cold rate; then the captures: prime_s in all), then is measured."""
    lanes = set(ops.LANE_DROPOUT)
    if name in ("ours_torch_dropout", "ours_compiled"):
        ops.LANE_DROPOUT.discard(chk.device.type)
    try:
        if chk.device.type == "cuda":  # the peak from here: the model, Adam, graphs, pool
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(chk.device)
        le = learner(name, shape, cfg["vocab"], chk.device, chk.dtype)
        step = learner_step(le)
        out = {"params": peers.n_params(le.model), "static": le.static}
        out["captured"] = captured = le.graphs is not None
        n, peak = peers.mfu_params(shape, cfg["vocab"]), chk.results["meta"]["peak_tflops"]
        work = peers.train_batches(
            cfg["vocab"],
            size,
            cfg["warmup"] + cfg["steps"],
            None,
            static=le.static,
            pairs=cfg["pairs"],
        )
        toks = sum(w.n_tgt for w in work)
        out["tgt_pad_efficiency"] = round(toks / sum(w.tgt_out.numel() for w in work), 4)
        if captured:
            t = time.perf_counter()
            first, _ = peers.timed(step, work, chk.device)
            for _ in range(PRIME - 1):
                for w in work:
                    step(w)
            peers.sync(chk.device)
            out["prime_s"] = round(time.perf_counter() - t, 2)
        fig = peers.measure_steps(
            step, work, cfg["warmup"], n, peak, chk.device, cold=not captured, reset_peak=False
        )
        if captured:
            fig["tokens_per_s_cold"] = round(toks / sum(first))  # first sight: eager, compiling
            fig["capture_s"] = round(le.graphs.capture_s, 2)
            fig["graphs"] = len(le.graphs.graphs)
        return {**out, **fig}
    finally:
        ops.LANE_DROPOUT.clear()
        ops.LANE_DROPOUT.update(lanes)


def corpus(d: Path, pairs: int, words: int = 20_000, seed: int = 0) -> None:
    """Raw text of `pairs` sentence pairs: Zipf-distributed made-up words, sentence lengths of
    TRAIN_LENGTHS (in units, read as words), the target a scrambled copy."""
    rng = random.Random(seed)
    vocab = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
        for _ in range(words)
    ]
    # cumulative weights once: rng.choices(vocab, weights) sums them again on every call (47x)
    cum = list(itertools.accumulate(1.0 / (k + 1) for k in range(words)))
    d.mkdir(parents=True)
    for split, n in (("train", pairs), ("valid", 200), ("test", 200)):
        src_lens, tgt_lens = peers.pair_lengths(n, peers.TRAIN_LENGTHS, seed + len(split))
        src = [" ".join(rng.choices(vocab, cum_weights=cum, k=int(s) - 1)) for s in src_lens]
        tgt = [" ".join(rng.choices(vocab, cum_weights=cum, k=int(t) - 1)) for t in tgt_lens]
        (d / f"{split}.en").write_text("\n".join(src) + "\n")
        (d / f"{split}.de").write_text("\n".join(tgt) + "\n")


def train_stage(
    shape: str, max_tokens: int, seconds: float, vocab: int, pairs: int, threads: int = 0
) -> dict:
    """`python -m transformer.train` for `seconds` of training on a synthetic corpus (made by the
    real tokenizer and shard stages): target tokens/s over its own training seconds (the final
    checkpoint's step and seconds; its batches' targets counted by replaying its sampler: no
    dvclive needed), its batch shapes and pad efficiency, and the path it said it runs."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        params = {
            "tokenizer": {"vocab_size": vocab, "min_frequency": 2},
            "shard": {"max_len": 256},
            "model": peers.SHAPES[shape],
            "train": {
                "max_tokens": max_tokens,
                "max_steps": 0,
                "time_budget_minutes": seconds / 60,
                "precision": "auto",
                "label_smoothing": peers.EPS,
                "valid_every_steps": 0,
                "save_every_steps": 0,
                "save_every_minutes": 0,
                "threads": threads,
            },
        }
        p = d / "params.yaml"
        p.write_text(yaml.safe_dump(params))
        t = time.perf_counter()
        corpus(d / "raw", pairs)
        py, env = sys.executable, {**os.environ, "PYTHONPATH": str(ROOT)}
        for argv in (
            ["transformer.tokenizer", d / "raw", d / "tok"],
            ["transformer.shard", d / "raw", d / "tok", d / "shards"],
        ):
            subprocess.run([py, "-m", *map(str, argv), "--params", str(p)], env=env, check=True)
        prep = time.perf_counter() - t
        cmd = [py, "-m", "transformer.train", d / "shards", d / "tok", d / "ckpt"]
        t = time.perf_counter()
        run = subprocess.run(
            [*map(str, cmd), "--params", str(p), "--no-progress"],
            env=env,
            capture_output=True,
            text=True,
            timeout=seconds + 240,
            check=False,
        )
        wall = time.perf_counter() - t
        if run.returncode:
            raise RuntimeError(f"the train stage failed: {run.stdout[-1500:]}{run.stderr[-1500:]}")
        ckpt = checkpoint.load(checkpoint.list_checkpoints(d / "ckpt")[-1])
        said = [ln for ln in run.stdout.splitlines() if ln.startswith("training in")]
        data = load_split(d / "shards", "train")
        static = bool(said) and STATIC in said[0]
        sampler = BatchSampler(data.src_lens, data.tgt_lens, max_tokens, 1, static=static)
        batches = (b for _ in range(ckpt["step"] // len(sampler) + 1) for b in sampler)
        tokens = sum(int(data.tgt_lens[idx].sum()) for idx in islice(batches, ckpt["step"]))
        return {
            "tokens_per_s": round(tokens / ckpt["train_seconds"]),
            "steps": ckpt["step"],
            "train_seconds": round(ckpt["train_seconds"], 1),
            **sampler.stats,
            "path": said[0] if said else None,
            "wall_s": round(wall, 1),
            "corpus_s": round(prep, 1),
            "vocab": vocab,
            "max_tokens": max_tokens,
        }


class CountOps(TorchDispatchMode):
    """Counts the ATen ops dispatched below autograd (what an eager update launches, one by one):
    all, views, dtype casts and matrix products."""

    MATMULS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu")

    def __init__(self):
        super().__init__()
        self.n = {"all": 0, "views": 0, "casts": 0, "matmuls": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.n["all"] += 1
        self.n["views"] += func.is_view
        self.n["casts"] += name == "_to_copy"
        self.n["matmuls"] += name in self.MATMULS
        return func(*args, **(kwargs or {}))


def count_ops(shape: str, max_tokens: int, dtype, static: bool) -> dict:
    """ATen ops of one update of the train stage (eager) on a CPU, for a model of `shape`'s
    structure (layers and heads; d_model / 8 and 1,000 units, so that it runs in seconds: the
    count does not depend on the widths), the output loss in one chunk as on a GPU."""
    s = dict(peers.SHAPES[shape])
    s["d_model"], s["d_ff"] = s["d_model"] // 8, s["d_ff"] // 8
    precision = "bf16" if dtype == torch.bfloat16 else "fp32"
    tcfg = TrainConfig(label_smoothing=peers.EPS, precision=precision)
    torch.manual_seed(0)
    le = Learner(ModelConfig(**s), tcfg, 1000, None, torch.device("cpu"), precision, static)
    work = peers.train_batches(1000, max_tokens, 2, None, static=static)
    step = learner_step(le)
    chunk, ops.CHUNK_ELEMENTS_CPU = ops.CHUNK_ELEMENTS_CPU, ops.CHUNK_ELEMENTS_GPU
    try:
        step(work[0])  # Adam's state is made in the first
        with CountOps() as c:
            step(work[1])
    finally:
        ops.CHUNK_ELEMENTS_CPU = chunk
    return c.n


if __name__ == "__main__":  # the op counts of docs/experiments/2026-11-26-gpu-update.md
    for shape in ("base", "big"):
        for dtype in (torch.bfloat16, torch.float32):
            for static in (False, True):
                n = count_ops(shape, 3125, dtype, static)
                print(shape, str(dtype)[6:], "static" if static else "dynamic", n, flush=True)
