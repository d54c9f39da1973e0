"""Decoding fixtures: a model trained to copy, its sources, and saved model + tokenizer files."""

from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from transformer import decode
from transformer.core.ids import EOS_ID
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.tokenizer import TokenizerConfig
from transformer.data.vocab import tokenizer_sha256
from transformer.model import checkpoint
from transformer.model.network import Transformer
from transformer.tokenizer import save_tokenizer, train_tokenizer

V = 24


LINES = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the bird sang a song",
    "two cats and a dog",
    "the sun is warm today",
    "we read a good book",
    "she likes green tea",
    "the train is late again",
]


def copy_batch(gen: torch.Generator, n: int):
    """The annotated transformer's copy task: target = source, lengths 2..8."""
    src, tgt_in, tgt_out = (torch.zeros(n, 10, dtype=torch.long) for _ in range(3))
    for i in range(n):
        L = int(torch.randint(2, 9, (1,), generator=gen))
        x = torch.randint(4, V, (L,), generator=gen)
        src[i, :L], src[i, L] = x, EOS_ID
        tgt_in[i, 0], tgt_in[i, 1 : L + 1] = 1, x
        tgt_out[i, :L], tgt_out[i, L] = x, EOS_ID
    return src[:, :9], tgt_in, tgt_out


@pytest.fixture(scope="module")
def copy_model() -> Transformer:
    """A model trained briefly on copying: it ends hypotheses at different lengths (real EOS)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2, dropout=0.0), V)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(120):
        src, tgt_in, tgt_out = copy_batch(gen, 32)
        loss, _ = model.loss(src, tgt_in, tgt_out, 0.0)
        opt.zero_grad()
        (loss / tgt_out.ne(0).sum()).backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def sources() -> torch.Tensor:
    return copy_batch(torch.Generator().manual_seed(7), 16)[0]


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("decode")
    (d / "train.txt").write_text("\n".join(LINES) + "\n")
    tok = train_tokenizer([d / "train.txt"], TokenizerConfig(vocab_size=300, min_frequency=1))
    save_tokenizer(tok, d / "tok", {})
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2, max_positions=32)
    model = Transformer(cfg, tok.get_vocab_size())
    checkpoint.save(
        d / "model.pt",
        {
            "model": model.state_dict(),
            "model_config": asdict(cfg),
            "step": 1,
            "train_seconds": 0.0,
            "vocab_size": tok.get_vocab_size(),
            "tokenizer_sha256": tokenizer_sha256(d / "tok"),
        },
    )
    return d / "model.pt", d / "tok"


def empty_params(d: Path) -> Path:
    """A params file with no sections: every setting at its default (the paper's decoding)."""
    (d / "empty.yaml").write_text("")
    return d / "empty.yaml"


def translate_file(model: Path, tok: Path, src: Path, out: Path, *extra: str) -> list[str]:
    """The translate CLI on file `src` into `out`, default settings but for `extra`; its lines."""
    args = ["--model", str(model), "--tokenizer", str(tok), "-i", str(src), "-o", str(out)]
    decode.main([*args, "--no-progress", "--params", str(empty_params(out.parent)), *extra])
    return out.read_text().split("\n")
