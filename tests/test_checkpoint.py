"""Checkpoint round trip and the clear errors: corrupt, foreign, other architecture."""

from __future__ import annotations

import argparse
import dataclasses
import pickle

import pytest
import torch

from transformer.core.sections.model import ARCH_KEYS, WEIGHT_KEYS, ModelConfig
from transformer.model import checkpoint
from transformer.model.checkpoint import CheckpointError
from transformer.model.network import Transformer


def make_ckpt(**cfg_kw) -> tuple[Transformer, dict]:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"d_model": 16, "d_ff": 32, "n_heads": 2, "n_layers": 2, **cfg_kw})
    model = Transformer(cfg, 30)
    ckpt = {
        "model": model.state_dict(),
        "model_config": dataclasses.asdict(cfg),
        "vocab_size": 30,
        "tokenizer_sha256": "x",
        "step": 7,
        "train_seconds": 1.5,
    }
    return model, ckpt


def test_round_trip_builds_identical_model(tmp_path):
    model, ckpt = make_ckpt()
    path = checkpoint.step_path(tmp_path, 7)
    checkpoint.save(path, ckpt)
    assert path.name == "step_00000007.pt"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # temp renamed away
    rebuilt = checkpoint.build_model(checkpoint.load(path), path)
    assert not rebuilt.training
    src = torch.randint(4, 30, (2, 5))
    torch.testing.assert_close(rebuilt(src, src), model.eval()(src, src), rtol=0, atol=0)


def test_corrupt_file_names_the_file(tmp_path):
    _, ckpt = make_ckpt()
    path = tmp_path / "step_00000001.pt"
    checkpoint.save(path, ckpt)
    path.write_bytes(path.read_bytes()[:200])  # truncated mid-write by something else
    with pytest.raises(CheckpointError, match=r"step_00000001\.pt: not a readable checkpoint"):
        checkpoint.load(path)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"hello")
    with pytest.raises(CheckpointError, match="junk.pt"):
        checkpoint.load(junk)


def flip_weight_bytes(path, weights: torch.Tensor) -> None:
    """Overwrite the last 64 bytes of `weights`' data inside the saved file with 0xFF (a NaN)."""
    blob = path.read_bytes()
    at = blob.index(weights.flatten()[-16:].numpy().tobytes())  # torch stores tensors raw
    path.write_bytes(blob[:at] + b"\xff" * 64 + blob[at + 64 :])


def test_flipped_weight_bytes_are_refused_naming_the_tensor(tmp_path):
    _, ckpt = make_ckpt()
    path = tmp_path / "model.pt"
    checkpoint.save(path, ckpt)
    flip_weight_bytes(path, ckpt["model"]["src_embed.weight"])
    loaded = checkpoint.load(path)  # the zip and the pickle are intact: only a value is wrong
    with pytest.raises(CheckpointError, match=r"model\.pt: model\.src_embed\.weight holds NaN"):
        checkpoint.build_model(loaded, path)


def test_not_a_checkpoint_and_unsafe_pickle(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(CheckpointError, match="missing key 'model'"):
        checkpoint.load(path)
    torch.save([1, 2], path)
    with pytest.raises(CheckpointError, match="a list"):
        checkpoint.load(path)
    with open(path, "wb") as f:  # arbitrary objects are refused by weights_only=True
        pickle.dump({"model": argparse.Namespace(cmd="rm -rf /")}, f, protocol=2)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        checkpoint.load(path)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        checkpoint.load(tmp_path / "missing.pt")


def test_other_architecture_names_the_key(tmp_path):
    _, ckpt = make_ckpt(n_layers=3)
    path = tmp_path / "other.pt"
    checkpoint.save(path, ckpt)
    model, _ = make_ckpt()
    with pytest.raises(CheckpointError, match=r"other\.pt: model_config\.n_layers is 3"):
        checkpoint.load_weights(model, checkpoint.load(path), path)
    _, ckpt = make_ckpt()
    ckpt["model"]["decoder.0.ff.w1.weight"] = torch.zeros(5, 5)  # same config, bad tensor
    with pytest.raises(CheckpointError, match=r"model\.decoder\.0\.ff\.w1\.weight has shape"):
        checkpoint.load_weights(model, ckpt, path)
    ckpt["vocab_size"] = 31
    with pytest.raises(CheckpointError, match="vocab_size is 31"):
        checkpoint.load_weights(model, ckpt, path)


def test_bad_stored_config_and_listing(tmp_path):
    _, ckpt = make_ckpt()
    ckpt["model_config"]["d_model"] = 15
    with pytest.raises(CheckpointError, match="divisible"):
        checkpoint.build_model(ckpt, "x.pt")
    ckpt["model_config"]["colour"] = "red"
    with pytest.raises(CheckpointError, match="model_config.colour"):
        checkpoint.build_model(ckpt, "x.pt")
    for s in (30, 4, 100):
        (tmp_path / f"step_{s:08d}.pt").touch()
    (tmp_path / "step_x.pt").touch()
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "step_00000004.pt",
        "step_00000030.pt",
        "step_00000100.pt",
    ]


def test_each_model_field_is_a_weight_key_or_leaves_the_weights_loadable(tmp_path):
    """WEIGHT_KEYS (the one list: a continued retrain keeps them, flows/retrain.py KEPT) are the
    fields a checkpoint loads only into a model that shares; every other field may differ.
    ARCH_KEYS, checked on model_config, are all but output_vocab, which the weights carry."""
    others = {f.name for f in dataclasses.fields(ModelConfig)} - set(WEIGHT_KEYS)
    assert others == {"dropout", "attention_dropout", "activation_dropout", "max_positions"}
    assert checkpoint.ARCH_KEYS is ARCH_KEYS
    assert set(WEIGHT_KEYS) - set(ARCH_KEYS) == {"output_vocab"}
    _, ckpt = make_ckpt()
    path = tmp_path / "m.pt"
    for k, v in {"dropout": 0.3, "attention_dropout": 0.2, "max_positions": 64}.items():
        model, _ = make_ckpt(**{k: v})
        checkpoint.load_weights(model, ckpt, path)
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2, output_vocab="target")
    target = Transformer(cfg, 30, torch.arange(4, 20))
    with pytest.raises(CheckpointError, match=r"m\.pt: model\.output_ids is missing"):
        checkpoint.load_weights(target, ckpt, path)
