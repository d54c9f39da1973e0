"""A tiny evaluate-stage input: raw splits, a tokenizer, two checkpoints and params.yaml."""

from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml

from transformer import average, evaluate
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.tokenizer import TokenizerConfig
from transformer.data.vocab import tokenizer_sha256
from transformer.model import checkpoint
from transformer.model.network import Transformer
from transformer.tokenizer import save_tokenizer, train_tokenizer

LINES = [
    "Ein Hund läuft im Park.",
    "Zwei Männer spielen Fußball.",
    "Eine Frau liest ein Buch.",
    "Das Kind isst einen Apfel.",
    "Ein Mann fährt Fahrrad.",
    "Die Katze schläft.",
    "Ein Mädchen singt ein Lied.",
    "Drei Leute warten am Bahnhof.",
]


@pytest.fixture(scope="module")
def stage_inputs(tmp_path_factory) -> Path:
    """raw/{valid,test}.{en,de}, a tokenizer, two checkpoints, params.yaml: a tiny pipeline."""
    d = tmp_path_factory.mktemp("evaluate")
    raw = d / "raw"
    raw.mkdir()
    for split in ("valid", "test"):
        (raw / f"{split}.de").write_text("\n".join(LINES) + "\n", encoding="utf-8")
        (raw / f"{split}.en").write_text("\n".join(LINES[::-1]) + "\n", encoding="utf-8")
    tok = train_tokenizer([raw / "valid.de"], TokenizerConfig(vocab_size=300, min_frequency=1))
    save_tokenizer(tok, d / "tokenizer", {})
    cfg = ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2)
    for step in (1, 2):
        torch.manual_seed(step)
        checkpoint.save(
            d / "ckpts" / f"step_{step:08d}.pt",
            {
                "model": Transformer(cfg, tok.get_vocab_size()).state_dict(),
                "model_config": asdict(cfg),
                "vocab_size": tok.get_vocab_size(),
                "step": step,
                "train_seconds": float(step),
                "tokenizer_sha256": tokenizer_sha256(d / "tokenizer"),
            },
        )
    (d / "params.yaml").write_text(
        yaml.safe_dump(
            {
                "average": {"last_k": 2},
                "evaluate": {"split": "test"},
                "decode": {"beam_size": 2, "max_len_b": 5},
            }
        )
    )
    return d


@pytest.fixture(scope="module")
def scored(stage_inputs):
    """stage_inputs averaged and evaluated: model.pt and its metrics, as dvc.yaml runs them."""
    d = stage_inputs
    params = ["--params", str(d / "params.yaml")]
    average.main([str(d / "ckpts"), str(d / "avg.pt"), *params])
    evaluate.main(
        [
            str(d / "avg.pt"),
            str(d / "tokenizer"),
            str(d / "raw"),
            str(d / "ev"),
            "--metrics",
            str(d / "ev.json"),
            "--no-progress",
            *params,
        ]
    )
    return d
