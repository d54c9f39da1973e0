"""Another line's champion for the tests of the lines that use one (issue 81): a small real
German->English model, trained here in-process on the synthetic demo corpus until it reads
the source (a few hundred updates of d_model 48), saved as a package (model.pt + tokenizer/).
Trained once per session: scoring and back-translation tests share it."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from transformer import download, shard, tokenizer
from transformer.core.layout import MODEL, TOKENIZER
from transformer.core.sections.model import ModelConfig
from transformer.data.batches import collate, load_split
from transformer.data.vocab import load_tokenizer, tokenizer_sha256
from transformer.model import checkpoint
from transformer.model.network import Transformer

PARAMS = {
    "download": {"src_lang": "de", "tgt_lang": "en", "synthetic": {"train": 2000, "valid": 200}},
    "tokenizer": {"vocab_size": 400, "min_frequency": 1},
}
MODEL_CFG = {"d_model": 48, "d_ff": 96, "n_heads": 2, "n_layers": 2, "dropout": 0.0}
STEPS, PAIRS, LR = 300, 32, 3e-3  # 19 or 20 of 20 misaligned pairs found on held-out pairs


def train_package(d: Path, params: dict, steps: int = STEPS) -> Path:
    """The synthetic corpus of `params` through the real download, tokenizer and shard stages,
    a model trained on it (Adam, `steps` updates of PAIRS random pairs), packaged in d/package;
    the raw folder is d/raw."""
    p = d / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    download.main([str(d / "raw"), "--params", str(p)])
    tokenizer.main([str(d / "raw"), str(d / "tok"), "--params", str(p)])
    shard.main([str(d / "raw"), str(d / "tok"), str(d / "shards"), "--params", str(p)])
    pairs = load_split(d / "shards", "train")
    torch.manual_seed(0)
    cfg = ModelConfig(**MODEL_CFG)
    vocab = load_tokenizer(d / "tok").size
    model = Transformer(cfg, vocab)
    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.98))
    rng = np.random.default_rng(0)
    for _ in range(steps):
        b = collate([pairs[int(i)] for i in rng.choice(len(pairs), PAIRS, replace=False)])
        loss, _ = model.loss(b.src, b.tgt_in, b.tgt_out, 0.0)
        opt.zero_grad()
        (loss / b.tgt_out.ne(0).sum()).backward()
        opt.step()
    pkg = d / "package"
    (pkg / TOKENIZER).mkdir(parents=True)
    for f in (d / "tok").iterdir():
        (pkg / TOKENIZER / f.name).write_bytes(f.read_bytes())
    checkpoint.save(
        pkg / MODEL,
        {
            "model": model.state_dict(),
            "model_config": asdict(cfg),
            "step": steps,
            "train_seconds": 0.0,
            "vocab_size": vocab,
            "tokenizer_sha256": tokenizer_sha256(d / "tok"),
        },
    )
    return pkg


@pytest.fixture(scope="session")
def de_en_helper(tmp_path_factory) -> Path:
    """The German->English package (its folder; its corpus beside it, in ../raw)."""
    return train_package(tmp_path_factory.mktemp("de-en-helper"), PARAMS)
