"""Best checkpoints and early stopping (transformer/training/selection.py): the best k survive the last-k
rotation, `average.by: best` averages exactly them, patience ends a run normally and survives a
SIGKILL resume, and a continued retrain gets the continuation's patience."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
import yaml
from helpers.train import kill_and_resume, run, write_params

from transformer import average
from transformer.average import AverageError
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.retrain import ContinuationConfig
from transformer.core.sections.train import TrainConfig
from transformer.model import checkpoint
from transformer.model.network import Transformer
from transformer.training.continuation import continued_train_config
from transformer.training.resume import write_checkpoint
from transformer.training.selection import Selection

CFG = ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2)


def fake(step: int, selection: dict | None = None) -> dict:
    """A checkpoint with its own random weights."""
    torch.manual_seed(step)
    ckpt = {
        "model": Transformer(CFG, 40).state_dict(),
        "model_config": asdict(CFG),
        "vocab_size": 40,
        "tokenizer_sha256": "abc",
        "step": step,
        "train_seconds": float(step),
    }
    return ckpt | ({"selection": selection} if selection else {})


def test_patience_counts_validations_without_an_improvement_of_min_delta():
    s = Selection(TrainConfig(best_metric="loss", keep_best=2, patience=2, min_delta=0.1), True)
    kept = [s.update(step, {"loss": x}) for step, x in [(1, 5.0), (2, 4.95), (3, 4.8), (4, 5.1)]]
    # 4.95 is better, not by 0.1: not an improvement, but among the best two
    assert kept == [True, True, True, False] and s.best == [[3, 4.8], [2, 4.95]]
    assert (s.best_score, s.best_step, s.since_best, s.stopped) == (4.8, 3, 1, False)
    s.update(5, {"loss": 4.75})
    assert s.stopped and s.summary(5, 100, 10.0)["stopped"] == "early"
    up = Selection(TrainConfig(best_metric="bleu", patience=1), True)
    up.update(1, {"bleu": 10.0, "loss": 1.0})
    up.update(2, {"bleu": 9.0, "loss": 0.5})  # higher is better for BLEU
    assert up.stopped and up.best_step == 1


def test_best_checkpoints_survive_the_last_k_rotation(tmp_path):
    for step in range(1, 7):
        write_checkpoint(tmp_path, fake(step), keep_last=2, keep_steps={1, 3})
    assert [checkpoint.step_of(p) for p in checkpoint.list_checkpoints(tmp_path)] == [1, 3, 5, 6]
    write_checkpoint(tmp_path, fake(7), keep_last=2, keep_steps={3})  # 1 left the best
    assert [checkpoint.step_of(p) for p in checkpoint.list_checkpoints(tmp_path)] == [3, 6, 7]


def test_average_by_best_averages_exactly_the_best_k(tmp_path):
    best = {"metric": "bleu", "best": [[3, 30.0], [1, 20.0], [4, 10.0]]}
    for step in range(1, 6):
        checkpoint.save(checkpoint.step_path(tmp_path, step), fake(step, best))
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"average": {"by": "best", "last_k": 2}}))
    average.main([str(tmp_path), str(tmp_path / "avg.pt"), "--params", str(params)])
    avg = torch.load(tmp_path / "avg.pt", weights_only=True)
    assert [a["step"] for a in avg["averaged"]] == [1, 3]  # the best two, not the last two
    a, b = fake(1)["model"], fake(3)["model"]
    for k, v in avg["model"].items():
        assert torch.equal(v, (a[k] + b[k]) / 2), k
    checkpoint.save(checkpoint.step_path(tmp_path, 6), fake(6))  # a newest one without a list
    with pytest.raises(AverageError, match="train.keep_best"):
        average.best_checkpoints(checkpoint.list_checkpoints(tmp_path), 2)


def test_early_stopping_ends_the_run_with_success_and_says_why(corpus, tmp_path):
    # loss as the metric, and no gain is ever 100: the first validation (step 3) stays the
    # best, and the second (step 6) is patience's 1
    over = {"max_steps": 30, "valid_every_steps": 3, "patience": 1, "min_delta": 100.0}
    params = write_params(tmp_path / "p.yaml", best_metric="loss", keep_best=1, **over)
    out = run(corpus, tmp_path / "ck", params, "--live", str(tmp_path / "live"))  # exit 0
    metrics = json.loads((tmp_path / "live" / "metrics.json").read_text())
    assert (metrics["stopped"], metrics["stopped_at"], metrics["step"]) == ("early", 6, 6)
    assert (metrics["best_metric"], metrics["best_step"]) == ("loss", 3)
    newest = checkpoint.load(checkpoint.list_checkpoints(tmp_path / "ck")[-1])
    assert newest["step"] == 6 and newest["final"] and "done: step 6" in out
    again = run(corpus, tmp_path / "ck", params, "--resume")  # stopped: nothing left to train
    assert "done: step 6" in again


@pytest.mark.slow  # three train processes, one SIGKILLed
def test_patience_state_resumes_exactly_after_sigkill(corpus, tmp_path):
    # validations at 20 and 40; a min_delta no gain reaches: the best stays step 20's
    over = {"best_metric": "loss", "keep_best": 2, "patience": 5, "min_delta": 100.0}
    kill_and_resume(corpus, tmp_path, **over)
    a, b = (checkpoint.load(checkpoint.step_path(tmp_path / r, 40)) for r in ("full", "killed"))
    sa, sb = a["selection"], b["selection"]
    sa.pop("bleu_seconds"), sb.pop("bleu_seconds")  # a duration
    assert sa == sb and sa["since_best"] == 1 and sa["best_step"] == 20
    assert [s for s, _ in sa["best"]] == sorted((20, 40), key=lambda s: dict(sa["best"])[s])


def test_a_continued_retrain_stops_by_the_continuations_patience():
    cont = ContinuationConfig(max_steps=500, patience=2)
    tcfg = continued_train_config(TrainConfig(patience=0), cont)
    assert (tcfg.patience, tcfg.max_steps) == (2, 500)
