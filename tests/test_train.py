"""The train stage: schedule, checkpoints + dvclive, exact SIGKILL resume, DDP == one process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.train import kill_and_resume, run, write_params

from transformer import train
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.train import TrainConfig
from transformer.core.settings import ConfigError
from transformer.data.batches import BatchSampler, load_split
from transformer.model import checkpoint, precision
from transformer.model.network import Transformer
from transformer.training.report import CpuShare


def test_rate_peaks_at_warmup_and_decays():
    cfg = TrainConfig(warmup_steps=100)
    lrs = [train.rate(s, cfg, 512) for s in range(1, 400)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 100  # §5.3
    assert lrs[99] == pytest.approx(512**-0.5 * 100**-0.5)
    assert train.rate(1, TrainConfig(warmup_steps=100, lr_scale=2.0), 512) == 2 * lrs[0]
    lin = TrainConfig(warmup_steps=100, lr_decay="linear")
    assert train.rate(100, lin, 512, progress=0.5) == pytest.approx(lrs[99] / 2)
    assert train.rate(100, lin, 512, progress=1.0) == 0.0
    cos = TrainConfig(warmup_steps=100, lr_decay="cosine")
    assert train.rate(100, cos, 512, progress=1.0) == pytest.approx(0.0, abs=1e-12)


def test_precision_auto_follows_the_hardware():
    cpu = torch.device("cpu")
    native = precision.native_bf16(cpu)
    assert precision.resolve_precision("auto", cpu, "train.precision") == (
        "bf16" if native else "fp32"
    )
    assert precision.resolve_precision("fp32", cpu, "train.precision") == "fp32"
    if native:
        assert precision.resolve_precision("bf16", cpu, "train.precision") == "bf16"
    else:  # emulated bf16 GEMMs are ~100x slower: refused, naming the key
        with pytest.raises(ConfigError, match="train.precision: bf16 needs native bf16"):
            precision.resolve_precision("bf16", cpu, "train.precision")


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy, read as CpuShare reads them."""
    return CpuShare.read()[1]


def own_seconds() -> float:
    own = os.times()
    return own.user + own.system


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="CpuShare reads Linux's /proc/stat")
def test_cpu_share_counts_other_processes_not_this_one():
    """Bounds that hold whatever else runs on the machine: a known load in another process is
    counted (a lower bound), and this process's own CPU time never is (an upper bound from the
    same counters, read around CpuShare's window)."""
    spin = "import time\nwhile time.process_time() < 1.0: pass"  # 1 CPU second
    t0, children0 = time.monotonic(), os.times()
    share = CpuShare()
    subprocess.run([sys.executable, "-c", spin], check=True)
    busy = share.sample()
    dt, children1 = time.monotonic() - t0, os.times()
    child = (
        children1.children_user
        + children1.children_system
        - children0.children_user
        - children0.children_system
    )
    assert child >= 0.9 and busy["others"] * dt >= 0.8 * child - 0.1, (busy, dt, child)

    busy0 = busy_seconds()
    share = CpuShare()
    own0, t1 = own_seconds(), time.monotonic()
    while own_seconds() - own0 < 1.0:  # this process, 1 CPU second
        pass
    own, dt = own_seconds() - own0, time.monotonic() - t1
    alone = share.sample()
    machine = busy_seconds() - busy0
    # others x its window >= others x dt, and its window lies inside [busy0, machine] and around
    # the spin: what it counted is at most the machine's busy time less this process's spin
    assert own >= 1.0 and alone["others"] * dt <= max(machine - own, 0.0) + 1e-9, (
        alone,
        dt,
        machine,
        own,
    )
    assert alone["steal"] >= 0

    warn = CpuShare.WARN_CORES
    assert "other processes used 0.5 of" in share.warning({"others": warn, "steal": 0.0})
    assert share.warning({"others": 2.0, "steal": 0.0}) is None  # at most one every 5 minutes
    assert CpuShare().warning({"others": warn - 0.01, "steal": 0.0}) is None


def test_train_writes_checkpoints_and_dvclive(corpus, tmp_path):
    params = write_params(tmp_path / "params.yaml")
    out = tmp_path / "ckpt"
    (out).mkdir()
    torch.save({"x": 1}, checkpoint.step_path(out, 99))  # a stale file of another run
    (out / ".step_00000099.pt.k1ll3d.tmp").write_bytes(b"half")  # a process killed as it saved
    train.main(
        [
            str(corpus / "shards"),
            str(corpus / "tok"),
            str(out),
            "--live",
            str(tmp_path / "live"),
            "--params",
            str(params),
            "--no-progress",
        ]
    )
    names = [p.name for p in checkpoint.list_checkpoints(out)]
    assert names == ["step_00000004.pt", "step_00000006.pt"]  # keep_last 2, the stale one aside
    assert sorted(p.name for p in out.iterdir()) == names  # and the half-written one gone
    (aside,) = (tmp_path / "ckpt.aside").iterdir()
    assert [p.name for p in aside.iterdir()] == ["step_00000099.pt"]
    assert checkpoint.load(out / names[0])["final"] is False
    ckpt = checkpoint.load(out / names[-1])
    assert ckpt["final"] is True
    assert ckpt["step"] == 6 and ckpt["train_seconds"] > 0
    assert {"optimizer", "rng", "data", "train_config", "scheduler"} <= set(ckpt)
    assert ckpt["model_config"]["d_model"] == 16 and ckpt["vocab_size"] == 300
    model = checkpoint.build_model(ckpt)
    assert not model.training
    metrics = json.loads((tmp_path / "live" / "metrics.json").read_text())
    assert metrics["step"] == 6 and metrics["valid"]["ppl"] > 1
    if Path("/proc/stat").exists():  # cores taken by other processes and by the hypervisor
        assert metrics["train"]["cpu_others"] >= 0 and metrics["train"]["cpu_steal"] >= 0
    rows = (tmp_path / "live" / "plots" / "metrics" / "train" / "loss.tsv").read_text().split()
    assert rows[:2] == ["step", "loss"] and [int(x) for x in rows[2::2]] == [1, 2, 3, 4, 5, 6]
    first, last = float(rows[3]), float(rows[-1])
    assert last < first  # it learns something in 6 updates
    valid = (tmp_path / "live" / "plots" / "metrics" / "valid" / "ppl.tsv").read_text().split()
    assert [int(x) for x in valid[2::2]] == [3, 6]


@pytest.mark.slow  # three train processes, one SIGKILLed
def test_sigkill_then_resume_is_bit_exact(corpus, tmp_path):
    kill_and_resume(corpus, tmp_path)


@pytest.mark.slow  # train processes run, killed and resumed
def test_a_truncated_newest_checkpoint_is_moved_aside_and_the_one_before_resumed(corpus, tmp_path):
    """A checkpoint cut short (a full disk, a dying machine) must not stop an unattended retry:
    it is named and moved aside, and the run continues from the one before, bit for bit."""
    params = write_params(
        tmp_path / "params.yaml",
        max_steps=20,
        save_every_steps=5,
        keep_last=0,
        valid_every_steps=10,
        log_every_steps=5,
    )
    run(corpus, tmp_path / "full", params)
    ckpts = tmp_path / "cut"
    ckpts.mkdir()
    for step in (5, 10, 15):
        shutil.copy(checkpoint.step_path(tmp_path / "full", step), ckpts)
    newest = checkpoint.step_path(ckpts, 15)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    out = run(corpus, ckpts, params, "--resume")
    aside = ckpts / "unreadable" / newest.name
    assert f"{newest}: not a readable checkpoint" in out and f"moved to {aside}" in out
    assert f"resuming from {checkpoint.step_path(ckpts, 10)} (step 10)" in out
    assert aside.is_file() and checkpoint.list_checkpoints(ckpts)[-1].name == "step_00000020.pt"
    a = checkpoint.load(checkpoint.step_path(tmp_path / "full", 20))
    b = checkpoint.load(checkpoint.step_path(ckpts, 20))
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    run(
        corpus, ckpts, write_params(tmp_path / "other.yaml", max_steps=5, lr_scale=1.0), "--resume"
    )  # another config starts fresh: the old run's unreadable files go too
    assert not aside.parent.exists()


@pytest.mark.slow  # four train processes
def test_another_recipes_checkpoints_are_moved_aside_intact_and_resume_from_there(corpus, tmp_path):
    """A run of another recipe (a line B in line A's workspace) must not destroy line A's
    checkpoints: they go, whole and loadable, to CKPT_DIR.aside/, B starts from step 1, and A's
    set put back resumes exactly as if never interrupted."""
    a, a_more = (write_params(tmp_path / f"a{n}.yaml", max_steps=n) for n in (6, 8))
    b = write_params(tmp_path / "b.yaml", lr_scale=1.0)
    ckpts = tmp_path / "ckpt"
    run(corpus, ckpts, a)
    before = {p.name: p.read_bytes() for p in ckpts.iterdir()}
    out = run(corpus, ckpts, b, "--resume")
    (aside,) = (tmp_path / "ckpt.aside").iterdir()
    assert f"moved aside to {aside}; this run counts its steps from 1" in out
    assert "train_config differs ['lr_scale']" in out and "resuming from" not in out
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == before  # intact
    assert checkpoint.load(aside / "step_00000006.pt")["train_config"]["lr_scale"] == 2.0
    ckpt_b = checkpoint.load(checkpoint.step_path(ckpts, 6))
    assert ckpt_b["train_config"]["lr_scale"] == 1.0 and ckpt_b["origin"] is None
    assert [checkpoint.step_of(p) for p in checkpoint.list_checkpoints(ckpts)] == [4, 6]

    ckpts.rename(tmp_path / "b_ckpt")  # line A's set back where the stage resumes from
    aside.rename(ckpts)
    out = run(corpus, ckpts, a_more, "--resume")
    assert f"resuming from {checkpoint.step_path(ckpts, 6)} (step 6)" in out
    run(corpus, tmp_path / "straight", a_more)  # never interrupted
    resumed = checkpoint.load(checkpoint.step_path(ckpts, 8))["model"]
    straight = checkpoint.load(checkpoint.step_path(tmp_path / "straight", 8))["model"]
    assert all(torch.equal(v, straight[k]) for k, v in resumed.items())


def test_at_most_keep_aside_sets_are_kept(tmp_path):
    from transformer.training.resume import KEEP_ASIDE, move_aside

    ckpts = tmp_path / "ckpt"
    sets = []
    for step in range(1, KEEP_ASIDE + 3):
        ckpts.mkdir(exist_ok=True)
        torch.save({"step": step}, checkpoint.step_path(ckpts, step))
        sets.append(move_aside(ckpts))
        assert list(ckpts.iterdir()) == [] and sets[-1].is_dir()
    assert sorted((tmp_path / "ckpt.aside").iterdir()) == sets[-KEEP_ASIDE:]
    assert [p.name for p in sets[-1].iterdir()] == [f"step_{KEEP_ASIDE + 2:08d}.pt"]


def signalled_once_saved(corpus: Path, tmp_path: Path, sig: int) -> tuple[int, str]:
    """A long run sent `sig` once its first checkpoint exists: (its exit status, its output)."""
    params = write_params(tmp_path / "params.yaml", max_steps=100000, save_every_steps=5)
    proc = run(corpus, tmp_path / "ck", params, wait=False)
    first = checkpoint.step_path(tmp_path / "ck", 5)
    while not first.exists() and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


def test_a_fatal_signal_prints_where_the_process_was(corpus, tmp_path):
    """A rank that dies of SIGABRT (a C++ abort) or SIGSEGV prints each thread's Python stack:
    torchrun's summary names only the signal."""
    code, out = signalled_once_saved(corpus, tmp_path, signal.SIGABRT)
    assert code == -signal.SIGABRT, out
    assert "Fatal Python error: Aborted" in out and 'transformer/train.py", line' in out, out


def test_ctrl_c_names_the_checkpoint_to_resume_from(corpus, tmp_path):
    code, out = signalled_once_saved(corpus, tmp_path, signal.SIGINT)
    assert code == 130, out
    newest = checkpoint.list_checkpoints(tmp_path / "ck")[-1]
    assert f"interrupted; --resume continues from {newest}" in out and "Traceback" not in out


@pytest.mark.slow  # torchrun with two gloo ranks
def test_two_gloo_processes_match_one_process(corpus, tmp_path):
    ds = load_split(corpus / "shards", "train")
    # the same global batches: 2 ranks x 1 micro-batch == 1 process x 2 micro-batches
    max_tokens = next(
        m
        for m in range(256, 400, 8)
        if len(BatchSampler(ds.src_lens, ds.tgt_lens, m, 1).batches) % 2 == 0
    )
    common = {
        "max_tokens": max_tokens,
        "max_steps": 3,
        "save_every_steps": 0,
        "valid_every_steps": 0,
    }
    one = write_params(tmp_path / "one.yaml", {"dropout": 0.0}, update_freq=2, **common)
    two = write_params(tmp_path / "two.yaml", {"dropout": 0.0}, update_freq=1, nproc=2, **common)
    run(corpus, tmp_path / "one", one)
    run(corpus, tmp_path / "two", two, nproc=2)
    a = checkpoint.load(checkpoint.step_path(tmp_path / "one", 3))
    b = checkpoint.load(checkpoint.step_path(tmp_path / "two", 3))
    assert b["world_size"] == 2 and len(b["rng"]) == 2
    start = Transformer(ModelConfig(**a["model_config"]), 300).state_dict()
    moved = 0
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=1e-4, atol=1e-5, msg=k)
        moved += not torch.equal(v, start[k])
    assert moved > 0  # the comparison is not between two untrained models


def test_bad_inputs_give_clear_errors(corpus, tmp_path):
    args = [str(corpus / "shards"), str(corpus / "tok"), str(tmp_path / "ckpt"), "--no-progress"]
    fp16 = write_params(tmp_path / "fp16.yaml", precision="fp16")
    with pytest.raises(SystemExit, match="fp16 needs CUDA"):
        train.main([*args, "--params", str(fp16)])
    bad = write_params(tmp_path / "bad.yaml", {"d_model": 18, "n_heads": 4})
    with pytest.raises(SystemExit, match="divisible by model.n_heads"):
        train.main([*args, "--params", str(bad)])
    ok = write_params(tmp_path / "ok.yaml")
    train.main([*args, "--params", str(ok)])  # a finished run, then its newest weights spoilt
    newest = checkpoint.list_checkpoints(tmp_path / "ckpt")[-1]
    spoilt = checkpoint.load(newest)
    spoilt["model"]["src_embed.weight"][0, 0] = float("nan")
    checkpoint.save(newest, spoilt)
    with pytest.raises(SystemExit, match=rf"{newest.name}: model\.src_embed\.weight holds NaN"):
        train.main([*args, "--params", str(ok), "--resume"])
    boom = write_params(tmp_path / "boom.yaml", lr_scale=1e30, max_steps=20, save_every_steps=1)
    with pytest.raises(SystemExit, match=r"non-finite loss .* at step \d+"):
        train.main([*args, "--params", str(boom)])
    saved = [checkpoint.load(p)["model"] for p in checkpoint.list_checkpoints(tmp_path / "ckpt")]
    assert all(torch.isfinite(t).all() for s in saved for t in s.values())


def test_resume_only_when_the_result_would_be_the_same(tmp_path):
    """A checkpoint is continued only if a fresh run with today's params reaches it too."""
    from dataclasses import asdict

    from transformer.core.sections.model import ModelConfig
    from transformer.core.sections.train import TrainConfig
    from transformer.model import checkpoint
    from transformer.training.resume import find_resume

    def meta(shards=("s1",), **train):
        return {
            "model_config": asdict(ModelConfig()),
            "vocab_size": 300,
            "world_size": 1,
            "tokenizer_sha256": "abc",
            "train_config": asdict(TrainConfig(**train)),
            "train_shards": list(shards),
        }

    checkpoint.save(
        checkpoint.step_path(tmp_path, 20),
        {**meta(max_steps=20), "model": {}, "step": 20, "optimizer": {}},
    )
    assert find_resume(tmp_path, meta(max_steps=40))[0] is not None  # more steps: continue
    assert find_resume(tmp_path, meta(max_steps=40, log_every_steps=3))[0] is not None
    # how often checkpoints are written and kept changes no weight: continue
    saving = meta(max_steps=40, keep_last=9, save_every_steps=7, save_every_minutes=3.0)
    assert find_resume(tmp_path, saving)[0] is not None
    # the update's path (eager, captured, compiled) changes no weight: continue
    assert find_resume(tmp_path, meta(max_steps=40, graphs="off", compile=True))[0] is not None
    path, why = find_resume(tmp_path, {**meta(max_steps=40), "output_ids": [4, 5, 9]})
    assert path is None and "output_ids differs" in why  # another softmax (valid changed)
    path, why = find_resume(tmp_path, meta(max_steps=10))  # fewer steps than already done
    assert path is None and "past train.max_steps" in why
    path, why = find_resume(tmp_path, meta(max_steps=40, lr_scale=2.0))  # another trajectory
    assert path is None and "lr_scale" in why
    path, why = find_resume(tmp_path, meta(max_steps=40, lr_decay="linear"))
    assert path is None and "lr_decay" in why
    path, why = find_resume(tmp_path, meta(("s2",), max_steps=40))  # other pairs, same tokenizer
    assert path is None and "train_shards differs" in why
    # a time budget: the same or a larger one continues; one below the minutes done does not
    budget = meta(max_steps=0, time_budget_minutes=5.0)
    checkpoint.save(
        checkpoint.step_path(tmp_path, 30),
        {**budget, "model": {}, "step": 30, "optimizer": {}, "train_seconds": 303.0},
    )
    assert find_resume(tmp_path, budget)[0] is not None
    assert find_resume(tmp_path, meta(max_steps=0, time_budget_minutes=10.0))[0] is not None
    # raised, if only to 5.01 minutes (below the 5.05 the run took): not lowered, continued
    assert find_resume(tmp_path, meta(max_steps=0, time_budget_minutes=5.01))[0] is not None
    path, why = find_resume(tmp_path, meta(max_steps=0, time_budget_minutes=2.0))
    assert (
        path is None and "303 s of training are past the lowered train.time_budget_minutes 2" in why
    )
    # a checkpoint older than a setting trained as its default does: continued at the default
    older = meta(max_steps=0, time_budget_minutes=5.0)
    del older["train_config"]["ema_decay"], older["train_config"]["spike_factor"]
    checkpoint.save(
        checkpoint.step_path(tmp_path, 40),
        {**older, "model": {}, "step": 40, "optimizer": {}, "train_seconds": 303.0},
    )
    assert find_resume(tmp_path, budget)[0] == checkpoint.step_path(tmp_path, 40)
    path, why = find_resume(tmp_path, meta(max_steps=0, time_budget_minutes=5.0, ema_decay=0.9))
    assert path is None and "train_config differs ['ema_decay']" in why


@pytest.mark.slow  # train processes run and resumed
def test_a_finished_budget_run_resumes_without_a_step_and_restores_lost_curves(corpus, tmp_path):
    params = write_params(
        tmp_path / "params.yaml",
        max_steps=0,
        time_budget_minutes=0.02,
        save_every_steps=0,
        valid_every_steps=0,
    )
    ckpt, live = tmp_path / "ckpt", tmp_path / "live"
    run(corpus, ckpt, params, "--live", str(live), "--resume")
    done = checkpoint.list_checkpoints(ckpt)
    before = [(p.name, p.stat().st_mtime_ns) for p in done]
    out = run(corpus, ckpt, params, "--live", str(live), "--resume")
    assert f"resuming from {done[-1]}" in out
    assert [(p.name, p.stat().st_mtime_ns) for p in checkpoint.list_checkpoints(ckpt)] == before
    step = checkpoint.load(done[-1])["step"]
    shutil.rmtree(live)  # a clone that pulled the checkpoints but not the curves
    run(corpus, ckpt, params, "--live", str(live), "--resume")
    assert [(p.name, p.stat().st_mtime_ns) for p in checkpoint.list_checkpoints(ckpt)] == before
    metrics = json.loads((live / "metrics.json").read_text())
    assert metrics["step"] == step and metrics["valid"]["nll"] > 0
    assert (live / "plots" / "metrics" / "valid" / "nll.tsv").read_text().split()[2] == str(step)


@pytest.mark.slow  # train processes run and resumed
def test_checkpoints_store_the_precision_the_run_resolved(corpus, tmp_path):
    """train.precision auto is bf16 on one host and fp32 on another: a checkpoint records which,
    and a resume on a host that resolves it otherwise starts afresh, saying why."""
    ckpt_dir = tmp_path / "ckpt"
    run(corpus, ckpt_dir, write_params(tmp_path / "p.yaml", precision="auto", max_steps=2))
    resolved = precision.resolve_precision("auto", torch.device("cpu"), "train.precision")
    last = checkpoint.list_checkpoints(ckpt_dir)[-1]
    ckpt = checkpoint.load(last)
    assert ckpt["train_config"]["precision"] == resolved
    ckpt["train_config"]["precision"] = "fp32" if resolved == "bf16" else "bf16"  # another host
    checkpoint.save(last, ckpt)
    params = write_params(tmp_path / "p.yaml", precision="auto", max_steps=4)
    out = run(corpus, ckpt_dir, params, "--resume")
    assert "not resuming" in out and "train_config differs ['precision']" in out, out


@pytest.mark.slow  # train processes run and resumed
def test_switching_the_update_path_on_resume_keeps_the_checkpoints(corpus, tmp_path):
    """train.graphs and train.compile are resume-free: a run turned to `graphs: off` at step 20
    goes on from its checkpoint (not from step 1) and ends where one run of 40 steps does, its
    weights, Adam and data position the same."""
    over = {"save_every_steps": 10, "keep_last": 0, "valid_every_steps": 20, "log_every_steps": 10}
    full = write_params(tmp_path / "full.yaml", max_steps=40, **over)
    run(corpus, tmp_path / "full", full)
    run(corpus, tmp_path / "switched", write_params(tmp_path / "a.yaml", max_steps=20, **over))
    off = write_params(tmp_path / "b.yaml", max_steps=40, graphs="off", **over)
    resumed = run(corpus, tmp_path / "switched", off, "--resume")
    assert f"resuming from {checkpoint.step_path(tmp_path / 'switched', 20)} (step 20)" in resumed
    a = checkpoint.load(checkpoint.step_path(tmp_path / "full", 40))
    b = checkpoint.load(checkpoint.step_path(tmp_path / "switched", 40))
    assert b["train_config"]["graphs"] == "off"
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["step"], sb["step"])
    assert a["data"] == b["data"]
