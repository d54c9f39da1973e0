"""The models loaded for decoding: a checkpoint (or an ensemble) and its tokenizer as one
Translator, text lines in and out (beam.py's search); the translate CLI, evaluation and
training's validation BLEU all decode through it."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer.core.ids import EOS_ID
from transformer.core.sections.decode import DecodeConfig
from transformer.data.vocab import Subwords, load_tokenizer, tokenizer_sha256
from transformer.model.beam import Sampling, nbest_ids, translate_ids
from transformer.model.checkpoint import build_model
from transformer.model.checkpoint import load as load_checkpoint
from transformer.model.incremental import Decoder, Ensemble


class DecodeError(ValueError):
    """A problem with decoding inputs (model file, tokenizer, input line), naming it."""


@dataclass
class Translator:
    """A checkpoint (or an ensemble) plus its tokenizer: text lines in, text lines out."""

    dec: Decoder | Ensemble
    tokenizer: Subwords
    cfg: DecodeConfig
    max_src: int  # source tokens (EOS included) the model can take

    def encode(self, lines: list[str], on_long: str = "truncate") -> list[list[int]]:
        """Ids (EOS appended) per line; an over-long line is truncated or rejected by number."""
        out = []
        encoded = self.tokenizer.encode([line.strip() for line in lines])
        for n, (line, enc) in enumerate(zip(lines, encoded), 1):
            if not line.strip():  # empty line in, empty line out
                out.append([])
                continue
            ids = enc
            if len(ids) + 1 > self.max_src:
                msg = f"line {n}: {len(ids) + 1} tokens, more than the model's {self.max_src}"
                if on_long == "error":
                    raise DecodeError(msg)
                print(f"warning: {msg}; truncated", file=sys.stderr)
                ids = ids[: self.max_src - 1]
            out.append(ids + [EOS_ID])
        return out

    def translate(
        self,
        lines: list[str],
        progress: bool = False,
        on_long: str = "truncate",
        sampling: Sampling | None = None,
    ) -> list[str]:
        """Translate lines (beam search, or with `sampling` one draw from the model each); an
        empty line gives an empty line."""
        units = self.tokenizer.size
        if sampling is None and self.cfg.beam_size > units:  # top-k of more than the vocabulary
            raise DecodeError(
                f"beam size {self.cfg.beam_size} is more than the vocabulary's "
                f"{units} units (--beam-size / decode.beam_size)"
            )
        srcs = self.encode(lines, on_long)
        hyps = translate_ids(self.dec, srcs, self.cfg, progress=progress, sampling=sampling)
        return [text if h else "" for h, text in zip(hyps, self.tokenizer.decode(hyps))]

    def translate_nbest(self, lines: list[str], n: int) -> list[list[str]]:
        """The n best translations of each line by beam search (n <= beam size), best first."""
        if n > self.cfg.beam_size:
            raise DecodeError(f"an n-best list of {n} from a beam of {self.cfg.beam_size}")
        lists = nbest_ids(self.dec, self.encode(lines), self.cfg, n)
        flat = [h for hyps in lists for h in hyps]
        texts = iter(text if h else "" for h, text in zip(flat, self.tokenizer.decode(flat)))
        return [[next(texts) for _ in hyps] for hyps in lists]


def timed(tr: Translator, lines: list[str], progress: bool = False) -> tuple[list[str], float]:
    """(the translations of `lines`, the seconds they took): the decoding speed every report of
    sentences per second measures (evaluate, race)."""
    t0 = time.perf_counter()
    out = tr.translate(lines, progress=progress)
    return out, time.perf_counter() - t0


def pick_device(name: str = "auto") -> torch.device:
    """--device: auto is the (current) CUDA GPU when torch sees one, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    elif name == "cuda" and not torch.cuda.is_available():
        raise DecodeError("--device cuda: torch sees no CUDA device (a CPU build of torch?)")
    return torch.device(name)


def load_translator(
    model_path: Path,
    tokenizer_dir: Path,
    cfg: DecodeConfig,
    precision: str = "fp32",
    ensemble: Sequence[Path] = (),
    device: torch.device | None = None,
) -> Translator:
    """The model from its checkpoint, with the tokenizer checked to be the one it trained with;
    with `ensemble`, those checkpoints too, decoding together with it (incremental.Ensemble).
    `device`: default pick_device("auto")."""
    tok = load_tokenizer(tokenizer_dir)
    device = device or pick_device()
    # one at a time: a Decoder is a copy, so only one member's loaded model is alive at once
    decs = [
        Decoder(_load_model(p, tokenizer_dir, tok), precision, device)
        for p in [model_path, *ensemble]
    ]
    dec = decs[0] if len(decs) == 1 else Ensemble(decs)
    return Translator(dec, tok, cfg, dec.max_positions)


def _load_model(model_path: Path, tokenizer_dir: Path, tok: Subwords) -> torch.nn.Module:
    ckpt = load_checkpoint(model_path, mmap=True)  # a training checkpoint's Adam state: unread
    model = build_model(ckpt, model_path)
    want, got = ckpt.get("tokenizer_sha256"), tokenizer_sha256(tokenizer_dir)
    if want and want != got:
        raise DecodeError(
            f"{tokenizer_dir}: tokenizer sha256 {got[:12]} is not the one "
            f"{model_path} was trained with ({want[:12]})"
        )
    if tok.size != model.vocab_size:
        raise DecodeError(
            f"{tokenizer_dir}: vocabulary of {tok.size} tokens, {model_path} has {model.vocab_size}"
        )
    return model
