"""Back-translation's test tools: a backward model's package and monolingual German text."""

from dataclasses import asdict
from pathlib import Path

import torch
import yaml

from transformer.core.layout import MODEL, TOKENIZER
from transformer.core.sections.backtranslate import BacktranslateConfig
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.tokenizer import TokenizerConfig
from transformer.data.vocab import tokenizer_sha256
from transformer.model import checkpoint
from transformer.model.network import Transformer
from transformer.tokenizer import save_tokenizer, train_tokenizer

GERMAN = [
    "der Hund spielt im Garten",
    "eine Frau liest ein Buch",
    "zwei Kinder laufen am Strand",
    "ein Mann fährt mit dem Fahrrad",
    "die Katze schläft auf dem Sofa",
    "ein Junge wirft einen roten Ball",
    "drei Leute sitzen vor einem Haus",
    "das Mädchen trinkt ein Glas Wasser",
]
ENGLISH = [
    "the dog plays in the garden",
    "a woman reads a book",
    "two children run on the beach",
    "a man rides a bike",
]


def german(n: int) -> list[str]:
    """n distinct German lines (numbered, so that dedup keeps them all)."""
    return [f"{GERMAN[i % len(GERMAN)]} {i}" for i in range(n)]


def backward_package(root: Path, src_lang: str = "de", tgt_lang: str = "en") -> Path:
    """A de -> en package folder (model.pt, tokenizer/): a real tokenizer trained on a few lines
    of both languages and a tiny random model; what the helpers stage leaves in its ROLE folder."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "text.txt").write_text("\n".join(GERMAN + ENGLISH) + "\n")
    tok = train_tokenizer([root / "text.txt"], TokenizerConfig(vocab_size=300, min_frequency=1))
    meta = {"type": "bpe", "src_lang": src_lang, "tgt_lang": tgt_lang, "min_frequency": 1}
    save_tokenizer(tok, root / TOKENIZER, meta)
    (root / "text.txt").unlink()
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=1, max_positions=64)
    model = Transformer(cfg, tok.get_vocab_size())
    checkpoint.save(
        root / MODEL,
        {
            "model": model.state_dict(),
            "model_config": asdict(cfg),
            "step": 1,
            "train_seconds": 0.0,
            "vocab_size": tok.get_vocab_size(),
            "tokenizer_sha256": tokenizer_sha256(root / TOKENIZER),
        },
    )
    return root


def bt_params(path: Path, **backtranslate) -> Path:
    """A params.yaml for an en -> de line that back-translates: short outputs, chunks of 4 lines
    and `backtranslate`; every key written (DVC wants each one a stage lists), the rest default."""
    over = {"max_len_a": 0.0, "max_len_b": 8, "chunk_lines": 4, **backtranslate}
    settings = asdict(BacktranslateConfig(**over))
    path.write_text(
        yaml.safe_dump(
            {"download": {"src_lang": "en", "tgt_lang": "de"}, "backtranslate": settings}
        )
    )
    return path
