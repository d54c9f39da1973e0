"""Back-translation (Sennrich et al. 2016): the monolingual part, text in the target language,
translated into the source language by the backward model (the reverse line's champion), so
that each line and its translation make a synthetic pair for the shard stage to mix into train.

    python -m transformer.backtranslate data/mono data/helpers/backward data/backtranslate \\
        --chunks data/backtranslate.chunks --metrics data/metrics/backtranslate.json

The search is backtranslate.search: the backward model's beam search, or one draw per line from
its distribution (Edunov et al. 2018), seeded per chunk, so a resumed run draws what an
uninterrupted one would. The text is translated chunk_lines lines at a time, and each finished
chunk is written atomically to a folder under --chunks named by a hash of all the result depends
on (the text, the model, its tokenizer, the settings). That folder is not a DVC output, since
DVC deletes a stage's outputs before running it: a killed run resumes after its last whole
chunk and never reuses chunks of other inputs. It is removed once the output is whole, and DVC
caches the output, so a second `dvc repro` translates nothing. Without a backward model (a
folder with no model.pt: the used line has no champion yet) or without monolingual text the
output holds no pairs and the metrics say why.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from transformer.core import allocator, failure, settings
from transformer.core.files import (
    atomic_dir,
    atomic_write,
    count_lines,
    remove_partial_writes,
    sha256_file,
    write_json,
)
from transformer.core.layout import MODEL, TOKENIZER
from transformer.core.sections.backtranslate import STAGE_KEYS, SYNTHETIC, BacktranslateConfig
from transformer.core.sections.decode import DecodeConfig
from transformer.core.sections.download import MONO_FILE, DownloadConfig
from transformer.core.settings import ConfigError
from transformer.data.vocab import TokenizerError, read_meta, tokenizer_sha256

if TYPE_CHECKING:
    from transformer.model.translator import Translator

log = logging.getLogger("transformer.backtranslate")
FORMAT = 1  # of the chunk folder: part of its name, so that another layout never resumes it
NONE = "NONE"  # the file of a helper's folder that holds no model, saying why (the helpers stage)


class BacktranslateError(RuntimeError):
    """A missing or mismatched input (text, model, direction); the message names it."""


def read_chunks(path: Path, size: int):
    """The file's lines (without "\\n"), `size` at a time."""
    with open(path, encoding="utf-8", newline="\n") as f:
        while chunk := [line.removesuffix("\n") for line in itertools.islice(f, size)]:
            yield chunk


def fingerprint(
    mono: Path, backward: Path, cfg: BacktranslateConfig, langs: tuple[str, str], model_sha: str
) -> str:
    """A hash of everything the translations depend on: the chunk folder's name."""
    inputs = {
        "format": FORMAT,
        "mono": sha256_file(mono),
        "model": model_sha,
        "tokenizer": tokenizer_sha256(backward / TOKENIZER),
        "settings": {k: asdict(cfg)[k] for k in STAGE_KEYS},
        "langs": list(langs),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


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

    remove_partial_writes(folder, "*")  # what a kill mid-write left
    n_chunks = -(-n_lines // cfg.chunk_lines)
    resumed = translated = lines_done = 0
    bar = tqdm(total=n_lines, desc="backtranslate", unit=" lines", mininterval=1.0, disable=None)
    seconds = 0.0
    for i, lines in enumerate(read_chunks(mono, cfg.chunk_lines)):
        path = folder / f"{i:06d}.{lang}"
        if path.is_file() and count_lines(path) == len(lines):
            resumed += 1
            bar.update(len(lines))
            continue
        sampling = None
        if cfg.search == "sample":
            gen = torch.Generator(device=tr.dec.device).manual_seed(chunk_seed(cfg.seed, i))
            sampling = Sampling(cfg.topk, gen)
        t0 = time.perf_counter()
        out = tr.translate(lines, sampling=sampling)
        seconds += time.perf_counter() - t0
        with atomic_write(path, "w", encoding="utf-8", newline="\n") as f:
            # one line each, whatever bytes the model produced ("\n" is a byte-level unit too)
            f.write("".join(" ".join(text.split()) + "\n" for text in out))
        translated += 1
        lines_done += len(lines)
        bar.update(len(lines))
        log.info("chunk %d/%d: %d lines translated", i + 1, n_chunks, len(lines))
    bar.close()
    done = resumed + translated
    if resumed:
        log.info("%d of %d chunks were already translated (resumed from %s)", resumed, done, folder)
    return {
        "chunks": done,
        "chunks_resumed": resumed,
        "chunks_translated": translated,
        "seconds": round(seconds, 2),
        "pairs_per_second": round(lines_done / seconds, 1) if seconds else None,
    }


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
            for i, lines in enumerate(read_chunks(mono, cfg.chunk_lines)):
                translations = (folder / f"{i:06d}.{langs[0]}").read_text(encoding="utf-8")
                for src, tgt in zip(translations.split("\n"), lines):
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
    folder = Path(chunks) / fingerprint(mono, backward, cfg, langs, model_sha)
    for stale in Path(chunks).glob("*") if Path(chunks).is_dir() else ():
        if stale.is_dir() and stale != folder:  # chunks of other inputs: never resumed again
            shutil.rmtree(stale)
    folder.mkdir(parents=True, exist_ok=True)
    tr = _translator(backward, cfg)
    stats = translate_chunks(tr, mono, n_lines, folder, cfg, langs[0])
    pairs = assemble(mono, folder, out_dir, cfg, langs)
    shutil.rmtree(folder)
    if not any(Path(chunks).iterdir()):
        Path(chunks).rmdir()
    backward_record = {
        "path": str(backward),
        "model_sha256": model_sha,
        "tokenizer_sha256": meta["tokenizer_sha256"],
        "direction": f"{meta['src_lang']}-{meta['tgt_lang']}",
    }
    return {**record, **pairs, **stats, "device": tr.dec.device.type, "backward": backward_record}


def _translator(backward: Path, cfg: BacktranslateConfig) -> Translator:
    """The backward model and its tokenizer, loaded for decoding (torch: only when needed)."""
    from transformer.model.checkpoint import CheckpointError
    from transformer.model.translator import DecodeError, load_translator

    decoding = DecodeConfig(
        beam_size=cfg.beam_size,
        length_penalty=cfg.length_penalty,
        max_len_a=cfg.max_len_a,
        max_len_b=cfg.max_len_b,
        batch_tokens=cfg.batch_tokens,
        precision=cfg.precision,
    )
    try:
        return load_translator(backward / MODEL, backward / TOKENIZER, decoding, cfg.precision)
    except (CheckpointError, DecodeError) as e:
        raise BacktranslateError(str(e)) from None


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
