"""Divergence without a person (transformer/training/rewind.py): a diverged run rewinds to its last good
checkpoint, skips the batches since, goes on at a lowered rate, the same way every time, and fails
naming the steps past train.max_rewinds; the rewinds survive a SIGKILL and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.train import kill_once_written, run, write_params

from transformer import train
from transformer.core.sections.train import TrainConfig
from transformer.core.settings import ConfigError
from transformer.model import checkpoint
from transformer.training.rewind import MIN_LOSS_SCALE, diverged

# logged every step, saved every 2: back to the newest checkpoint a good read tested (step 4's
# weights gave step 5's loss; step 6's, only the diverged step 7's)
INJECTED = {"kind": "non-finite", "first": 7, "last": 7, "back": 4}


def train_main(corpus: Path, ckpt: Path, params: Path, *extra: str) -> None:
    args = [str(corpus / "shards"), str(corpus / "tok"), str(ckpt), "--params", str(params)]
    train.main([*args, "--no-progress", *extra])


def tsv(live: Path, name: str) -> list[tuple[int, float]]:
    rows = (live / "plots" / "metrics" / f"{name}.tsv").read_text().split("\n")[1:]
    return [(int(r.split("\t")[0]), float(r.split("\t")[1])) for r in rows if r]


def test_an_injected_divergence_is_rewound_the_same_way_every_time(corpus, tmp_path, capsys):
    over = {"max_steps": 12, "save_every_steps": 2, "keep_last": 0, "valid_every_steps": 6}
    params = write_params(tmp_path / "params.yaml", inject_divergence_at=7, **over)
    train_main(corpus, tmp_path / "a", params, "--live", str(tmp_path / "live_a"))
    train_main(corpus, tmp_path / "b", params)
    out = capsys.readouterr().out
    back = checkpoint.step_path(tmp_path / "a", 4)
    assert (
        f"non-finite loss (nan) at step 7: rewound to {back} (step 4), the batches of step(s) 5-7 "
        "skipped (and their checkpoints removed), the rate x0.5 for 100 updates (rewind 1 of at most 3)"
    ) in out
    a = checkpoint.load(checkpoint.step_path(tmp_path / "a", 12))
    b = checkpoint.load(checkpoint.step_path(tmp_path / "b", 12))
    for k, v in a["model"].items():
        assert torch.isfinite(v).all() and torch.equal(v, b["model"][k]), k  # same seed, same run
    assert a["rewind"]["events"] == b["rewind"]["events"] == [INJECTED]
    redone = checkpoint.load(checkpoint.step_path(tmp_path / "a", 6))  # removed, written again
    assert redone["rewind"]["events"] == [INJECTED]
    assert a["data"]["batch"] == 15  # 12 updates, 3 batches skipped (an epoch has more)
    metrics = json.loads((tmp_path / "live_a" / "metrics.json").read_text())["train"]
    assert (metrics["rewinds"], metrics["diverged_at"], metrics["skipped_updates"]) == (1, 7, 3)
    lr = tsv(tmp_path / "live_a", "train/lr")
    assert [s for s, _ in lr] == list(range(1, 13))  # the diverged step's row logged once
    cfg = TrainConfig(warmup_steps=4, lr_scale=2.0)
    assert lr[4][1] == pytest.approx(0.5 * train.rate(5, cfg, 16))  # lowered after the rewind
    assert lr[3][1] == pytest.approx(train.rate(4, cfg, 16))  # not before


def test_past_max_rewinds_or_without_a_checkpoint_the_run_fails_naming_the_steps(
    corpus, tmp_path, capsys
):
    # a rate that ruins the weights in one update (finite, so its checkpoint is good to go back
    # to): every rewind diverges again
    boom = write_params(tmp_path / "boom.yaml", lr_scale=1e30, save_every_steps=1, max_rewinds=2)
    with pytest.raises(SystemExit) as e:
        train_main(corpus, tmp_path / "boom", boom)
    assert str(e.value) == (  # (no checkpoint before step 1: back to the one at step 1)
        "error: non-finite loss (nan) at step 2: train.max_rewinds (2) spent on the divergences "
        "at steps 2 (back to 1), 2 (back to 1); stopping before any checkpoint of it is written"
    )
    assert capsys.readouterr().out.count("rewound to") == 2
    first = write_params(tmp_path / "first.yaml", inject_divergence_at=1)
    with pytest.raises(SystemExit, match="at step 1, and no checkpoint of finite weights at or"):
        train_main(corpus, tmp_path / "first", first)
    off = write_params(tmp_path / "off.yaml", inject_divergence_at=3, max_rewinds=0)
    with pytest.raises(SystemExit) as e:  # 0: as before rewinds existed
        train_main(corpus, tmp_path / "off", off, "--live", str(tmp_path / "live"))
    assert str(e.value) == (
        "error: non-finite loss (nan) at step 3; stopping before any checkpoint of it is written"
    )
    assert "rewinds" not in json.loads((tmp_path / "live" / "metrics.json").read_text())["train"]
    saved = checkpoint.list_checkpoints(tmp_path / "off")
    assert [p.name for p in saved] == ["step_00000002.pt"]


def test_a_real_loss_spike_is_rewound_and_the_run_goes_on(corpus, tmp_path, capsys):
    """A rate 15x too high: the loss jumps to ~8x its running mean, the run goes back and
    finishes at a tenth of the rate."""
    params = write_params(
        tmp_path / "params.yaml",
        max_steps=10,
        lr_scale=30.0,
        save_every_steps=1,
        keep_last=3,
        rewind_lr_factor=0.1,
    )
    train_main(corpus, tmp_path / "ckpt", params)
    out = capsys.readouterr().out
    assert out.count("rewound to") == 1 and "done: step 10" in out
    assert "loss spike (" in out and "at step 3: rewound to" in out
    final = checkpoint.load(checkpoint.step_path(tmp_path / "ckpt", 10))
    assert final["rewind"]["events"] == [{"kind": "spike", "first": 3, "last": 3, "back": 1}]


def test_a_spike_and_the_fp16_loss_scale_at_its_floor_diverge():
    assert diverged(3.1, 1.0, 3.0, None)[0] == "spike"
    assert diverged(2.9, 1.0, 3.0, None) is None
    assert diverged(30.0, 1.0, 0.0, None) is None  # spike_factor 0: off
    assert diverged(30.0, None, 3.0, None) is None  # no running mean yet
    # a real GradScaler halving its scale on overflowing gradients, down to the floor
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=4 * MIN_LOSS_SCALE)
    scales = []
    for _ in range(2):
        scaler.scale((w * float("inf")).sum()).backward()
        scaler.step(opt)  # skipped: the gradients overflowed
        scaler.update()
        scales.append(scaler.get_scale())
        assert diverged(1.0, 1.0, 3.0, scales[-1]) == (
            None
            if scales[-1] > MIN_LOSS_SCALE
            else ("loss scale", f"fp16 loss scale {scales[-1]:g} at its floor {MIN_LOSS_SCALE:g}")
        )
    assert scales == [2 * MIN_LOSS_SCALE, MIN_LOSS_SCALE] and torch.equal(w, torch.ones(2))


def test_bad_rewind_settings_name_the_key():
    for key, bad in (
        ("spike_factor", 1.0),
        ("rewind_lr_factor", 0.0),
        ("rewind_lr_factor", 1.5),
        ("max_rewinds", -1),
        ("rewind_updates", -1),
        ("inject_divergence_at", -1),
    ):
        with pytest.raises(ConfigError, match=f"train.{key}"):
            TrainConfig(**{key: bad})


@pytest.mark.slow  # a train process SIGKILLed, and its resume
def test_the_rewinds_survive_a_sigkill_and_resume(corpus, tmp_path, capsys):
    """Killed after a rewind and a checkpoint since: the resumed run goes on at the lowered rate,
    with the rewind counted, and ends with the uninterrupted run's weights, bit for bit."""
    params = write_params(
        tmp_path / "params.yaml",
        max_steps=20,
        save_every_steps=5,
        keep_last=0,
        valid_every_steps=15,
        log_every_steps=5,
        inject_divergence_at=7,
        rewind_updates=12,  # lowered up to step 17: past the kill
    )
    train_main(corpus, tmp_path / "full", params)  # uninterrupted
    assert "non-finite loss (nan) at step 6-10: rewound to" in capsys.readouterr().out
    proc = run(corpus, tmp_path / "killed", params, wait=False)
    kill_once_written(proc, checkpoint.step_path(tmp_path / "killed", 10))  # after the rewind
    newest = checkpoint.list_checkpoints(tmp_path / "killed")[-1]
    assert 10 <= checkpoint.load(newest)["step"] < 20
    event = {"kind": "non-finite", "first": 6, "last": 10, "back": 5}
    assert checkpoint.load(newest)["rewind"]["events"] == [event]
    resumed = run(corpus, tmp_path / "killed", params, "--resume")
    assert f"resuming from {newest}" in resumed and "rewound" not in resumed
    a = checkpoint.load(checkpoint.step_path(tmp_path / "full", 20))
    b = checkpoint.load(checkpoint.step_path(tmp_path / "killed", 20))
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k  # bit for bit
    assert a["rewind"] == b["rewind"] and b["rewind"]["events"] == [event]
    assert a["data"] == b["data"]


@pytest.mark.slow  # torchrun with two gloo ranks
def test_two_gloo_ranks_rewind_together(corpus, tmp_path):
    params = write_params(
        tmp_path / "params.yaml", max_steps=10, save_every_steps=2, inject_divergence_at=7
    )
    out = run(corpus, tmp_path / "ckpt", params, nproc=2)
    assert out.count("rewound to") == 1  # rank 0 says it; both ranks go back, or one would hang
    final = checkpoint.load(checkpoint.step_path(tmp_path / "ckpt", 10))
    assert final["rewind"]["events"] == [INJECTED] and len(final["rng"]) == 2
    assert all(torch.isfinite(t).all() for t in final["model"].values())


def test_a_rewind_restores_the_best_checkpoints_of_the_step_it_goes_back_to(corpus, tmp_path):
    # validated (and a best kept) at steps 3, 6, 9 and 10; step 7 diverges, back to step 4: the
    # best list is step 4's again, so step 6 is validated afresh, not listed twice
    over = {"max_steps": 10, "save_every_steps": 2, "keep_last": 0, "valid_every_steps": 3}
    params = write_params(
        tmp_path / "params.yaml", inject_divergence_at=7, keep_best=5, best_metric="loss", **over
    )
    train_main(corpus, tmp_path / "ck", params)
    last = checkpoint.load(checkpoint.step_path(tmp_path / "ck", 10))
    assert last["rewind"]["events"] == [INJECTED]
    steps = [s for s, _ in last["selection"]["best"]]
    assert sorted(steps) == [3, 6, 9, 10]
    for s in steps:
        assert checkpoint.step_path(tmp_path / "ck", s).is_file(), s


def test_a_rewind_restores_the_ema_of_the_step_it_goes_back_to(corpus, tmp_path):
    over = {"max_steps": 10, "save_every_steps": 2, "keep_last": 0, "valid_every_steps": 0}
    params = write_params(tmp_path / "params.yaml", inject_divergence_at=7, ema_decay=0.9, **over)
    train_main(corpus, tmp_path / "ck", params)
    last = checkpoint.load(checkpoint.step_path(tmp_path / "ck", 10))
    assert last["rewind"]["events"] == [INJECTED]
    for k, v in last["ema"].items():  # the diverged update's NaN weights reached the EMA
        assert torch.isfinite(v).all(), k
