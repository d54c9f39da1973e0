"""Back-translation (Sennrich et al. 2016): the monolingual part, text in the target language,
translated into the source language by the backward model (the reverse line's champion), so
that each line and its translation make a synthetic pair for the shard stage to mix into train.

    python -m transformer.backtranslate data/mono data/helpers/backward data/backtranslate \\
        --chunks data/backtranslate.chunks --metrics data/metrics/backtranslate.json

The search is backtranslate.search: the backward model's beam search, or one draw per line from
its distribution (Edunov et al. 2018), seeded per chunk, so a resumed run draws what an
uninterrupted one would. The text is translated chunk_lines lines at a time, each finished chunk
kept under --chunks (transformer/model/chunked.py, shared with the distill stage): a killed run
resumes after its last whole chunk, and DVC caches the output, so a second `dvc repro`
translates nothing. Without a backward model (a folder with no model.pt: the used line has no
champion yet) or without monolingual text the output holds no pairs and the metrics say why.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from transformer.core import allocator, failure, settings
from transformer.core.files import atomic_dir, count_lines, sha256_file, write_json
from transformer.core.layout import MODEL, TOKENIZER
from transformer.core.sections.backtranslate import STAGE_KEYS, SYNTHETIC, BacktranslateConfig
from transformer.core.sections.download import MONO_FILE, DownloadConfig
from transformer.core.settings import ConfigError
from transformer.data.vocab import TokenizerError, read_meta, tokenizer_sha256
from transformer.model import chunked

if TYPE_CHECKING:
    from transformer.model.translator import Translator

log = logging.getLogger("transformer.backtranslate")
NONE = "NONE"  # the file of a helper's folder that holds no model, saying why (the helpers stage)


class BacktranslateError(RuntimeError):
    """A missing or mismatched input (text, model, direction); the message names it."""


def fingerprint(
    mono: Path, backward: Path, cfg: BacktranslateConfig, langs: tuple[str, str], model_sha: str
) -> str:
    """A hash of everything the translations depend on: the chunk folder's name."""
    return chunked.key(
        {
            "mono": sha256_file(mono),
            "model": model_sha,
            "tokenizer": tokenizer_sha256(backward / TOKENIZER),
            "settings": {k: asdict(cfg)[k] for k in STAGE_KEYS},
            "langs": list(langs),
        }
    )


def check_direction(backward: Path, langs: tuple[str, str]) -> dict[str, Any]:
    """The backward model's tokenizer meta, refused unless it translates tgt_lang -> src_lang."""
    try:
        meta = read_meta(backward / TOKENIZER)
    except TokenizerError as e:
        raise BacktranslateError(str(e)) from None
    have, want = (meta.get("src_lang"), meta.get("tgt_lang")), (langs[1], langs[0])
    if have != want:
        raise BacktranslateError(
            f"{backward / TOKENIZER}/meta.json: a {have[0]}->{have[1]} model; back-translation "
            f"for {langs[0]}->{langs[1]} needs a {want[0]}->{want[1]} one (the reverse line's)"
        )
    return meta


def chunk_seed(seed: int, chunk: int) -> int:
    """The sampling seed of one chunk: independent streams, the same in a resumed run."""
    return int(np.random.SeedSequence([seed, chunk]).generate_state(1)[0])


def translate_chunks(
    tr: Translator, mono: Path, n_lines: int, folder: Path, cfg: BacktranslateConfig, lang: str
) -> dict[str, Any]:
    """Translate `mono` chunk by chunk into `folder` (the finished chunks skipped); counts."""
    import torch

    from transformer.model.beam import Sampling

    def one(i: int, parts: list[list[str]]) -> list[str]:
        sampling = None
        if cfg.search == "sample":
            gen = torch.Generator(device=tr.dec.device).manual_seed(chunk_seed(cfg.seed, i))
            sampling = Sampling(cfg.topk, gen)
        return tr.translate(parts[0], sampling=sampling)

    return chunked.translate([mono], n_lines, folder, cfg.chunk_lines, lang, one, "backtranslate")


def assemble(
    mono: Path, folder: Path, out_dir: Path, cfg: BacktranslateConfig, langs: tuple[str, str]
) -> dict[str, int]:
    """out_dir/synthetic.{src,tgt}: each line and its translation, empty translations left out."""
    kept = empty = 0
    with atomic_dir(out_dir) as tmp:
        paths = [tmp / SYNTHETIC.format(lang=lang) for lang in langs]
        with (
            open(paths[0], "w", encoding="utf-8", newline="\n") as fs,
            open(paths[1], "w", encoding="utf-8", newline="\n") as ft,
        ):
            for i, lines in enumerate(chunked.read_chunks(mono, cfg.chunk_lines)):
                for src, tgt in zip(chunked.translations(folder, i, langs[0]), lines):
                    if not src.strip():
                        empty += 1
                        continue
                    fs.write(src + "\n")
                    ft.write(tgt + "\n")
                    kept += 1
    return {"pairs": kept, "empty_dropped": empty}


def empty_output(out_dir: Path, langs: tuple[str, str]) -> None:
    with atomic_dir(out_dir) as tmp:
        for lang in langs:
            (tmp / SYNTHETIC.format(lang=lang)).write_text("")


def backtranslate(
    mono_dir: Path,
    backward: Path,
    out_dir: Path,
    chunks: Path,
    cfg: BacktranslateConfig,
    langs: tuple[str, str],
) -> dict[str, Any]:
    """The stage: translate mono_dir's text with the package `backward` into out_dir; metrics."""
    mono, backward = Path(mono_dir) / MONO_FILE.format(lang=langs[1]), Path(backward)
    if not mono.is_file():
        raise BacktranslateError(f"{mono}: missing (run the download stage with --mono)")
    n_lines = count_lines(mono)
    record: dict[str, Any] = {"lines": n_lines, **{k: asdict(cfg)[k] for k in STAGE_KEYS}}
    if not backward.is_dir():
        raise BacktranslateError(f"{backward}: no such folder (the backward model's package)")
    why = None
    if n_lines == 0:
        why = "no monolingual text (download.monolingual)"
    elif not (backward / MODEL).is_file():  # the helpers stage's NONE says why
        none = backward / NONE
        why = none.read_text().strip() if none.is_file() else f"no {MODEL} in {backward}"
    if why:
        log.warning("nothing to back-translate: %s", why)
        empty_output(out_dir, langs)
        return {**record, "pairs": 0, "backward": None, "skipped": why}
    meta = check_direction(backward, langs)
    model_sha = sha256_file(backward / MODEL)
    folder = chunked.folder(chunks, fingerprint(mono, backward, cfg, langs, model_sha))
    tr = chunked.load(backward, cfg, BacktranslateError)
    stats = translate_chunks(tr, mono, n_lines, folder, cfg, langs[0])
    pairs = assemble(mono, folder, out_dir, cfg, langs)
    chunked.finish(chunks, folder)
    return {
        **record,
        **pairs,
        **stats,
        "device": tr.dec.device.type,
        "backward": chunked.used(backward, model_sha, meta),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.backtranslate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("mono", type=Path, help="the download stage's --mono folder")
    parser.add_argument("backward", type=Path, help="the backward model's package folder")
    parser.add_argument("out", type=Path, help="output folder: synthetic.{src,tgt lang}")
    parser.add_argument("--chunks", type=Path, required=True, help="finished chunks, for resuming")
    parser.add_argument("--metrics", type=Path, help="write the counts here (JSON)")
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    allocator.keep_freed_memory()  # see there: 2x decoding speed on glibc
    try:
        cfg = settings.load(BacktranslateConfig, "backtranslate", args.params)
        dl = settings.load(DownloadConfig, "download", args.params)
        langs = (dl.src_lang, dl.tgt_lang)
        metrics = backtranslate(args.mono, args.backward, args.out, args.chunks, cfg, langs)
    except (BacktranslateError, ConfigError, TokenizerError, OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: {e}")
    if args.metrics:
        write_json(args.metrics, metrics)
    print(f"backtranslate: {metrics['pairs']} synthetic pairs of {metrics['lines']} lines")


if __name__ == "__main__":
    failure.recorded("backtranslate", main)()
