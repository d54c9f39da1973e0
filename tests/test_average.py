"""Checkpoint averaging: exact mean, dtype kept, no optimizer, odd one out named, selection."""

from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml

from transformer import average
from transformer.average import AverageError, average_checkpoints, select_checkpoints
from transformer.core.sections.average import AverageConfig
from transformer.core.sections.model import ModelConfig
from transformer.model.checkpoint import build_model
from transformer.model.network import Transformer

CFG = ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2)


def make_ckpt(
    path: Path,
    seed: int,
    step: int,
    seconds: float = 0.0,
    cfg: ModelConfig = CFG,
    vocab: int = 40,
    dtype=torch.float32,
) -> Path:
    torch.manual_seed(seed)
    model = Transformer(cfg, vocab).to(dtype)
    opt = torch.optim.Adam(model.parameters())
    model(torch.tensor([[5, 6, 2]]), torch.tensor([[1, 5]])).float().sum().backward()
    opt.step()  # a real optimizer state, which the average must leave out
    torch.save(
        {
            "model": model.state_dict(),
            "model_config": asdict(cfg),
            "vocab_size": vocab,
            "tokenizer_sha256": "abc",
            "step": step,
            "train_seconds": seconds,
            "optimizer": opt.state_dict(),
        },
        path,
    )
    return path


def test_two_checkpoints_average_to_their_exact_mean(tmp_path):
    a, b = make_ckpt(tmp_path / "a.pt", 1, 100), make_ckpt(tmp_path / "b.pt", 2, 200)
    avg = average_checkpoints([a, b])
    sa, sb = (torch.load(p, weights_only=True)["model"] for p in (a, b))
    for k in sa:
        assert torch.equal(avg["model"][k], (sa[k] + sb[k]) / 2), k
    assert "optimizer" not in avg and avg["step"] == 200
    assert [x["step"] for x in avg["averaged"]] == [100, 200]
    build_model(avg)  # loads into a model of the stored config


def test_dtype_is_kept_and_accumulation_is_fp32(tmp_path):
    paths = [make_ckpt(tmp_path / f"{i}.pt", i, i, dtype=torch.bfloat16) for i in range(3)]
    avg = average_checkpoints(paths)
    states = [torch.load(p, weights_only=True)["model"] for p in paths]
    k = "decoder.0.ff.w1.weight"
    assert avg["model"][k].dtype == torch.bfloat16
    want = (sum(s[k].float() for s in states) / 3).to(torch.bfloat16)
    assert torch.equal(avg["model"][k], want)


def test_mismatched_architecture_names_the_odd_one_out(tmp_path):
    make_ckpt(tmp_path / "step_00000001.pt", 1, 1)
    odd = make_ckpt(tmp_path / "step_00000002.pt", 2, 2, cfg=ModelConfig(16, 64, 2, 2))
    make_ckpt(tmp_path / "step_00000003.pt", 3, 3)
    with pytest.raises(AverageError, match=r"step_00000002\.pt: differs .*model_config"):
        average_checkpoints(sorted(tmp_path.glob("*.pt")))
    assert odd.exists()


def test_vocabulary_mismatch_and_junk_files_are_named(tmp_path):
    a = make_ckpt(tmp_path / "a.pt", 1, 1)
    b = make_ckpt(tmp_path / "b.pt", 2, 2, vocab=41)
    c = make_ckpt(tmp_path / "c.pt", 3, 3)
    with pytest.raises(AverageError, match=r"b\.pt: differs .*vocab_size"):
        average_checkpoints([a, b, c])
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(AverageError, match="junk.pt: not a readable checkpoint"):
        average_checkpoints([a, junk])


def test_the_average_takes_the_newest_step_whatever_the_order(tmp_path):
    a, b = make_ckpt(tmp_path / "a.pt", 1, 600, seconds=60.0), make_ckpt(tmp_path / "b.pt", 2, 200)
    avg = average_checkpoints([a, b])
    assert avg["step"] == 600 and avg["train_seconds"] == 60.0
    assert [x["step"] for x in avg["averaged"]] == [600, 200]


def test_a_checkpoint_with_nan_weights_is_named_not_averaged(tmp_path):
    a, b = make_ckpt(tmp_path / "a.pt", 1, 1), make_ckpt(tmp_path / "b.pt", 2, 2)
    ckpt = torch.load(b, weights_only=True)
    ckpt["model"]["decoder.0.ff.w1.weight"][0, 0] = float("inf")
    torch.save(ckpt, b)
    with pytest.raises(
        AverageError, match=r"b\.pt: model\.decoder\.0\.ff\.w1\.weight holds NaN or inf"
    ):
        average_checkpoints([a, b])


def test_select_by_steps_and_by_time(tmp_path):
    # saved every 4 minutes of training: 0, 240, ..., 2160 s
    for i in range(10):
        make_ckpt(tmp_path / f"step_{(i + 1) * 100:08d}.pt", i, (i + 1) * 100, seconds=240.0 * i)
    steps = select_checkpoints(tmp_path, AverageConfig(last_k=3, by="steps"))
    assert [p.name for p in steps] == ["step_00000800.pt", "step_00000900.pt", "step_00001000.pt"]
    timed = select_checkpoints(tmp_path, AverageConfig(last_k=3, by="time", interval_minutes=10))
    # newest (2160 s), then the newest at least 600 s older (1440 s), then (720 s)
    assert [p.name for p in timed] == ["step_00000400.pt", "step_00000700.pt", "step_00001000.pt"]


def test_cli_writes_weights_only_model(tmp_path, capsys):
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    for i in range(4):
        make_ckpt(ckpts / f"step_{i + 1:08d}.pt", i, i + 1)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"average": {"last_k": 2}}))
    out = tmp_path / "model.pt"
    average.main([str(ckpts), str(out), "--params", str(params)])
    ckpt = torch.load(out, weights_only=True)
    assert set(ckpt) == {
        "model",
        "model_config",
        "vocab_size",
        "tokenizer_sha256",
        "step",
        "train_seconds",
        "averaged",
    }
    assert [a["path"] for a in ckpt["averaged"]] == ["step_00000003.pt", "step_00000004.pt"]
    assert len(ckpt["averaged"][0]["sha256"]) == 64
    with pytest.raises(SystemExit, match="error: .*params.yaml: not a readable checkpoint"):
        average.main([str(params), str(out), "--out", str(tmp_path / "x.pt")])
    with pytest.raises(SystemExit, match="error: .*no step_"):
        empty = tmp_path / "empty"
        empty.mkdir()
        average.main([str(empty), str(out), "--params", str(params)])


def test_missing_checkpoint_dir_is_named(tmp_path):
    with pytest.raises(SystemExit, match=r"error: .*nope: no such checkpoint directory"):
        average.main([str(tmp_path / "nope"), str(tmp_path / "model.pt")])
