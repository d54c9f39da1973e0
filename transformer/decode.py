"""Translate: the models loaded for decoding (transformer/beam.py's search), and the CLI.

python -m transformer.decode --model data/model.pt --tokenizer data/tokenizer < in.en > out.de
transformer-translate --model data/model.pt --tokenizer data/tokenizer -i in.en -o out.de
transformer-translate --model a/data/model.pt --ensemble b/data/model.pt --tokenizer ...
transformer-translate --model champion/ -i in.en      # a package (the package stage's folder)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from transformer import allocator, files, settings
from transformer.beam import translate_ids
from transformer.checkpoint import CheckpointError, build_model
from transformer.checkpoint import load as load_checkpoint
from transformer.files import atomic_write
from transformer.ids import EOS_ID
from transformer.incremental import Decoder, Ensemble
from transformer.sections.decode import MAX_ALPHA, DecodeConfig
from transformer.settings import ConfigError
from transformer.vocab import Subwords, TokenizerError, load_tokenizer, tokenizer_sha256


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
        self, lines: list[str], progress: bool = False, on_long: str = "truncate"
    ) -> list[str]:
        """Translate lines; an empty line gives an empty line."""
        units = self.tokenizer.size
        if self.cfg.beam_size > units:  # top-k of more than the vocabulary: no such beams
            raise DecodeError(
                f"beam size {self.cfg.beam_size} is more than the vocabulary's "
                f"{units} units (--beam-size / decode.beam_size)"
            )
        hyps = translate_ids(self.dec, self.encode(lines, on_long), self.cfg, progress=progress)
        return [text if h else "" for h, text in zip(hyps, self.tokenizer.decode(hyps))]


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


def read_lines(path: Path | None) -> list[str]:
    """files.read_lines, from stdin when `path` is None; a DecodeError names the line."""
    return files.read_lines(path, DecodeError)


def write_lines(path: Path | None, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path is None:
        sys.stdout.write(text)
    else:
        with atomic_write(Path(path), "w", encoding="utf-8") as f:
            f.write(text)


def add_decode_args(parser: argparse.ArgumentParser, multi: bool = False) -> None:
    """The decoding flags shared by the translate and evaluate CLIs: more checkpoints to
    ensemble, and the params.yaml `decode` overrides."""
    parser.add_argument(
        "--ensemble",
        type=Path,
        nargs="+",
        default=[],
        metavar="CHECKPOINT",
        help="more checkpoints (same tokenizer) to decode together with the model: each step "
        "takes the mean of their probabilities (e.g. a run's last checkpoints, or other seeds)",
    )
    parser.add_argument(
        "--params",
        type=Path,
        help=f"params.yaml whose sections give the defaults (default: ./{settings.PARAMS}; "
        "translate without one uses the paper's decoding settings)",
    )
    parser.add_argument(
        "--beam-size",
        type=int,
        nargs="+" if multi else None,
        help=("beam sizes, each scored" if multi else "beam size")
        + " (1 = greedy); default: params decode.beam_size",
    )
    parser.add_argument(
        "--length-penalty",
        type=float,
        help=f"GNMT alpha in [0, {MAX_ALPHA:g}]; default: params",
    )
    parser.add_argument(
        "--precision", choices=("fp32", "bf16", "int8"), help="default: params (int8: CPU only)"
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where to decode; auto: the GPU when torch sees one, else the CPU",
    )


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    # no params.yaml (translating outside the project folder): the paper's defaults; a file
    # named with --params must exist
    cfg = DecodeConfig()
    if args.params is not None or settings.PARAMS.exists():
        cfg = settings.load(DecodeConfig, "decode", args.params or settings.PARAMS)
    beams = args.beam_size if isinstance(args.beam_size, list) else [args.beam_size]
    if any(k is not None and k < 1 for k in beams):  # the flag named, not the params key
        raise ConfigError(f"--beam-size must be >= 1, got {min(beams)}")
    if args.length_penalty is not None and not 0 <= args.length_penalty <= MAX_ALPHA:
        raise ConfigError(
            f"--length-penalty must be in [0, {MAX_ALPHA:g}], got {args.length_penalty}"
        )
    over = {
        "beam_size": beams[0],
        "length_penalty": args.length_penalty,
        "precision": args.precision,
    }
    return replace(cfg, **{k: v for k, v in over.items() if v is not None})


def unpack(args: argparse.Namespace) -> None:
    """--model DIR, a package: its model.pt, and its tokenizer/ and params.yaml where the
    command line names none."""
    if args.model.is_dir():
        pkg = args.model
        if not (pkg / "model.pt").is_file():
            raise DecodeError(
                f"{pkg}: a folder without model.pt: not a package (--model takes a "
                "checkpoint file or a package folder)"
            )
        args.model = pkg / "model.pt"
        args.tokenizer = args.tokenizer or pkg / "tokenizer"
        if args.params is None and (pkg / settings.PARAMS.name).is_file():
            args.params = pkg / settings.PARAMS.name
    if args.tokenizer is None:
        raise DecodeError("--tokenizer is required unless --model is a package folder")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="transformer-translate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        type=Path,
        required=True,
        help="checkpoint (trained or averaged), or a package folder (model.pt, tokenizer/, "
        "params.yaml: what `dvc artifacts get` fetches), whose tokenizer and decoding settings "
        "are then the defaults",
    )
    parser.add_argument(
        "--tokenizer", type=Path, help="tokenizer directory (required unless --model is a package)"
    )
    parser.add_argument(
        "-i", "--input", type=Path, help="source text, one sentence a line; default stdin"
    )
    parser.add_argument("-o", "--output", type=Path, help="translations; default stdout")
    parser.add_argument(
        "--on-long",
        choices=("truncate", "error"),
        default="truncate",
        help="a line longer than the model's max_positions: truncate (with a warning) or fail",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_decode_args(parser)
    args = parser.parse_args(argv)
    allocator.keep_freed_memory()  # see there: 2x decoding speed on glibc
    try:
        unpack(args)
        cfg = decode_config(args)
        tr = load_translator(
            args.model, args.tokenizer, cfg, cfg.precision, args.ensemble, pick_device(args.device)
        )
        lines = read_lines(args.input)
        write_lines(args.output, tr.translate(lines, not args.no_progress, args.on_long))
    except (DecodeError, CheckpointError, ConfigError, TokenizerError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
