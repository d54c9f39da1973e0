"""A tiny real training setup: params, a synthetic corpus through the real stages, the CLI."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from helpers import forked
from helpers.forked import ROOT
from transformer import download, shard, tokenizer
from transformer.model import checkpoint

MODEL = {"d_model": 16, "d_ff": 32, "n_heads": 2, "n_layers": 2, "dropout": 0.1}


TRAIN = {
    "max_tokens": 256,
    "max_steps": 6,
    "warmup_steps": 4,
    "lr_scale": 2.0,
    "threads": 1,
    "save_every_steps": 2,
    "save_every_minutes": 0.0,
    "keep_last": 2,
    "valid_every_steps": 3,
    "log_every_steps": 1,
}


def write_params(path: Path, model: dict | None = None, **train_over) -> Path:
    params = {
        "download": {"synthetic": {"train": 300, "valid": 30, "test": 10}},
        "tokenizer": {"vocab_size": 300, "min_frequency": 1},
        "model": {**MODEL, **(model or {})},
        "train": {**TRAIN, **train_over},
    }
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A tiny synthetic corpus through the real download -> tokenizer -> shard stages."""
    d = tmp_path_factory.mktemp("corpus")
    p = str(write_params(d / "params.yaml"))
    download.main([str(d / "raw"), "--params", p])
    tokenizer.main([str(d / "raw"), str(d / "tok"), "--params", p])
    shard.main([str(d / "raw"), str(d / "tok"), str(d / "shards"), "--params", p])
    return d


def run(
    corpus: Path, ckpt: Path, params: Path, *extra: str, nproc: int = 0, wait: bool = True
) -> subprocess.Popen | forked.Forked | str:
    """The real CLI in a process of its own (forked: helpers/forked.py; or torchrun with `nproc`
    gloo ranks): its output."""
    args = [corpus / "shards", corpus / "tok", ckpt, "--params", params, "--no-progress", *extra]
    if nproc:
        proc = torchrun(nproc, [str(a) for a in args])
    else:
        proc = forked.start("transformer.train", *args, merged=True)
    if wait:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        return out
    return proc


def torchrun(nproc: int, args: list[str]) -> subprocess.Popen:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd = [*launcher, f"--nproc_per_node={nproc}", "-m", "transformer.train", *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def kill_once_written(proc: subprocess.Popen, path: Path) -> None:
    """SIGKILL the train process `proc` (no cleanup, no final checkpoint) once `path` exists."""
    while not path.exists() and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "finished before it could be killed"


def kill_and_resume(corpus: Path, tmp_path: Path, **train_over) -> str:
    """A run of 40 steps, and one SIGKILLed after its first checkpoint and resumed: their
    step-40 checkpoints are equal bit for bit. The uninterrupted run's output (test_cuda.py
    runs this on a GPU in bf16 and fp16)."""
    params = write_params(
        tmp_path / "params.yaml",
        max_steps=40,
        save_every_steps=5,
        keep_last=0,
        valid_every_steps=20,
        log_every_steps=5,
        **train_over,
    )
    out = run(corpus, tmp_path / "full", params)
    proc = run(corpus, tmp_path / "killed", params, "--resume", wait=False)
    first = checkpoint.step_path(tmp_path / "killed", 5)
    kill_once_written(proc, first)
    done = checkpoint.list_checkpoints(tmp_path / "killed")
    newest = checkpoint.load(done[-1])["step"]
    assert done[0] == first and newest < 40  # killed mid-way (normally right after step 5)
    resumed = run(corpus, tmp_path / "killed", params, "--resume")
    assert f"resuming from {done[-1]} (step {newest})" in resumed
    a = checkpoint.load(checkpoint.step_path(tmp_path / "full", 40))
    b = checkpoint.load(checkpoint.step_path(tmp_path / "killed", 40))
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k  # bit for bit
    assert a.keys() == b.keys()  # train.ema_decay: the EMA too (ema.py)
    for k, v in a.get("ema", {}).items():
        assert torch.equal(v, b["ema"][k]), f"ema.{k}"
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    assert a["data"] == b["data"] and a["scaler"] == b["scaler"]
    return out
