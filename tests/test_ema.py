"""train.ema_decay: the EMA's update is its formula, in fp32 under bf16, swapped in and out
exactly; a SIGKILLed run resumes it bit for bit; validation reads it; the average stage
averages the checkpoints' EMAs (average.weights: ema)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from helpers.graphs import cpu_learner
from helpers.static import MODEL, V, lengths, pairs
from helpers.train import corpus, kill_and_resume, run, write_params  # noqa: F401

from transformer import average
from transformer.average import AverageError, average_checkpoints
from transformer.core.sections.average import AverageConfig
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.train import TrainConfig
from transformer.core.settings import ConfigError
from transformer.data.batches import BatchSampler, collate, load_split
from transformer.data.vocab import tokenizer_sha256
from transformer.model import checkpoint
from transformer.model.network import Transformer
from transformer.training import ema
from transformer.training.learner import Learner, n_targets
from transformer.training.validation import validate


def learner(precision: str = "fp32") -> Learner:
    torch.manual_seed(0)
    cfg = ModelConfig(**MODEL)
    return Learner(cfg, TrainConfig(), V, None, torch.device("cpu"), precision)


def batches(n: int = 3) -> list:
    s, t = lengths(24, seed=5, longest=12)
    data = pairs(s, t)
    return [collate([data[i] for i in idx]) for idx in BatchSampler(s, t, 64, 1)][:n]


def test_the_update_is_the_formula_for_a_few_real_updates():
    le, decay = learner(), 0.75
    avg = ema.EMA(le.model, decay)
    want = {k: v.double().clone() for k, v in le.model.state_dict().items()}  # starts at w_0
    for b in batches(3):
        le.step([b], n_targets(b), 1e-3)
        avg.update()
        for k, w in le.model.state_dict().items():  # by hand, in fp64: d * ema + (1 - d) * w
            want[k] = decay * want[k] + (1 - decay) * w.double()
    got = avg.state_dict()
    assert got.keys() == want.keys()
    for k, w in le.model.state_dict().items():
        torch.testing.assert_close(got[k].double(), want[k], rtol=1e-6, atol=1e-7)
        assert not torch.equal(got[k], w), k  # behind the weights, not a copy of them


def test_after_a_captured_update_the_average_reads_the_updated_weights():
    """The EMA runs outside the capture, after the replay: on the captured path (graphs.py's
    bookkeeping, static shapes, gradients kept) it follows the formula as on the eager one."""
    le = cpu_learner(captured=True)
    avg, decay = ema.EMA(le.model, 0.5), 0.5
    want = {k: v.double().clone() for k, v in le.model.state_dict().items()}
    s, t = lengths(24, seed=5, longest=12)
    sampler = BatchSampler(s, t, 64, 1, static=True)
    data = pairs(s, t)
    b = collate([data[i] for i in next(iter(sampler))], sampler.shape)
    for _ in range(4):  # two warm-ups, the capture's replay, a replay
        le.step([b], n_targets(b), 1e-3)
        avg.update()
        for k, w in le.model.state_dict().items():
            want[k] = decay * want[k] + (1 - decay) * w.double()
    assert len(le.graphs.graphs) == 1  # the last two updates were replays
    for k, v in avg.state_dict().items():
        torch.testing.assert_close(v.double(), want[k], rtol=1e-6, atol=1e-7)


def test_the_average_is_fp32_under_bf16_autocast():
    le = learner("bf16")
    avg = ema.EMA(le.model, 0.9)
    b = batches(1)[0]
    le.step([b], n_targets(b), 1e-3)
    avg.update()
    assert {v.dtype for v in avg.state_dict().values()} == {torch.float32}
    # a bf16 copy of the weights (not a master weight) is averaged in fp32 too
    half = Transformer(ModelConfig(**MODEL), V).to(torch.bfloat16)
    assert {t.dtype for t in ema.EMA(half, 0.9).shadow} == {torch.float32}


def test_swapped_holds_the_average_inside_and_restores_the_weights_bit_for_bit():
    le = learner()
    avg = ema.EMA(le.model, 0.5)
    for b in batches(2):
        le.step([b], n_targets(b), 1e-3)
        avg.update()
    before = {k: v.clone() for k, v in le.model.state_dict().items()}
    with avg.swapped():
        for k, v in le.model.state_dict().items():
            assert torch.equal(v, avg.state_dict()[k]), k
    for k, v in le.model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_ema_decay_must_be_below_one():
    assert TrainConfig(ema_decay=0.999).ema_decay == 0.999
    for bad in (1.0, -0.1):
        with pytest.raises(ConfigError, match="train.ema_decay"):
            TrainConfig(ema_decay=bad)
    with pytest.raises(ConfigError, match="average.weights"):
        AverageConfig(weights="best")


@pytest.mark.slow  # three train processes, one SIGKILLed
def test_sigkill_then_resume_restores_the_ema_bit_for_bit(corpus, tmp_path):  # noqa: F811
    kill_and_resume(corpus, tmp_path, ema_decay=0.9)
    last = checkpoint.load(checkpoint.step_path(tmp_path / "full", 40))
    assert {v.dtype for v in last["ema"].values()} == {torch.float32}
    assert any(not torch.equal(v, last["model"][k]) for k, v in last["ema"].items())


@pytest.fixture(scope="module")
def ema_run(corpus, tmp_path_factory):  # noqa: F811
    """Six updates with ema_decay 0.5, validated and saved at steps 3 and 6."""
    d = tmp_path_factory.mktemp("ema_run")
    params = write_params(
        d / "params.yaml", ema_decay=0.5, save_every_steps=3, valid_every_steps=3, keep_last=0
    )
    run(corpus, d / "ckpt", params, "--live", str(d / "live"))
    return d


@pytest.mark.slow  # a train process (the module's one)
def test_validation_reads_the_ema_when_on(corpus, ema_run):  # noqa: F811
    ckpt = checkpoint.load(checkpoint.step_path(ema_run / "ckpt", 6))
    live = json.loads((ema_run / "live" / "metrics.json").read_text())
    tcfg = TrainConfig(**ckpt["train_config"])
    valid = load_split(corpus / "shards", "valid", tokenizer_sha256(corpus / "tok"))
    losses, fp32 = {}, lambda: torch.autocast("cpu", enabled=False)
    for which in ("ema", "model"):
        model = checkpoint.build_model({**ckpt, "model": ema.weights(ckpt, which)})
        v = validate(model, valid, tcfg, torch.device("cpu"), fp32)
        losses[which] = v["loss"]
    assert live["valid"]["loss"] == pytest.approx(losses["ema"], rel=1e-9)
    assert losses["model"] != pytest.approx(losses["ema"], rel=1e-6)  # so it could fail


@pytest.mark.slow  # a train process (the module's one)
def test_average_of_ema_weights_is_the_mean_of_the_checkpoints_emas(ema_run, tmp_path):
    paths = [checkpoint.step_path(ema_run / "ckpt", s) for s in (3, 6)]
    a, b = (checkpoint.load(p) for p in paths)
    avg = average_checkpoints(paths, "ema")
    assert avg["weights"] == "ema"
    for k in a["model"]:
        assert torch.equal(avg["model"][k], (a["ema"][k] + b["ema"][k]) / 2), k
        assert not torch.equal(avg["model"][k], (a["model"][k] + b["model"][k]) / 2), k
    # the stage: params.yaml's average.weights picks them from CKPT_DIR
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"average": {"last_k": 2, "weights": "ema"}}))
    average.main([str(ema_run / "ckpt"), str(tmp_path / "model.pt"), "--params", str(params)])
    out = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(torch.equal(out["model"][k], avg["model"][k]) for k in avg["model"])
    checkpoint.build_model(out)


def test_averaging_ema_weights_of_a_run_without_them_names_the_file(tmp_path):
    model = Transformer(ModelConfig(**MODEL), V)
    cfg = ModelConfig(**MODEL).__dict__
    p = tmp_path / "step_00000001.pt"
    torch.save({"model": model.state_dict(), "model_config": cfg, "vocab_size": V, "step": 1}, p)
    with pytest.raises(AverageError, match=r"step_00000001.pt: no ema weights"):
        average_checkpoints([p], "ema")
