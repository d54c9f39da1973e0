"""Translate: the models loaded for decoding (transformer/model/beam.py's search), and the CLI.

python -m transformer.decode --model data/model.pt --tokenizer data/tokenizer < in.en > out.de
transformer-translate --model data/model.pt --tokenizer data/tokenizer -i in.en -o out.de
transformer-translate --model a/data/model.pt --ensemble b/data/model.pt --tokenizer ...
transformer-translate --model champion/ -i in.en      # a package (the package stage's folder)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from transformer.core import allocator, files, settings
from transformer.core.files import atomic_write
from transformer.core.layout import MODEL, PARAMS, TOKENIZER
from transformer.core.sections.decode import MAX_ALPHA, DecodeConfig
from transformer.core.settings import ConfigError
from transformer.data.vocab import TokenizerError
from transformer.model.checkpoint import CheckpointError
from transformer.model.translator import DecodeError, load_translator, pick_device


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
        if not (pkg / MODEL).is_file():
            raise DecodeError(
                f"{pkg}: a folder without {MODEL}: not a package (--model takes a "
                "checkpoint file or a package folder)"
            )
        args.model = pkg / MODEL
        args.tokenizer = args.tokenizer or pkg / TOKENIZER
        if args.params is None and (pkg / PARAMS).is_file():
            args.params = pkg / PARAMS
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
