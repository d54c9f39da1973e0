"""A long translation made chunk by chunk, so that a killed run resumes: the machinery the
backtranslate and distill stages share (a champion of another line translating a whole file).

A file is translated `size` lines at a time; each finished chunk is written atomically into a
folder named by a hash of everything the result depends on (the text, the model, its tokenizer,
the settings: `key`). That folder is not a DVC output, since DVC deletes a stage's outputs
before running it: a killed run finds its whole chunks there and translates only the rest, and
never reuses chunks of other inputs (`folder` removes them). The stage assembles its output from
the chunks and then removes the folder (`finish`); DVC caches the output, so a second `dvc
repro` translates nothing. Torch-free until `load` loads the translating package; the
caller's function does the decoding.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from transformer.core.files import atomic_write, count_lines, remove_partial_writes
from transformer.core.layout import MODEL, TOKENIZER

if TYPE_CHECKING:
    from transformer.model.translator import Translator

log = logging.getLogger("transformer.model.chunked")
# of a chunk folder: part of its key, so that another layout is never resumed
FORMAT = 1
# a stage's search settings (the backtranslate and distill sections share decode's names)
SEARCH = ("beam_size", "length_penalty", "max_len_a", "max_len_b", "batch_tokens", "precision")


def load(package: Path, cfg: Any, error: type[Exception]) -> Translator:
    """The package's model and tokenizer, loaded to decode with the SEARCH settings of `cfg`
    (a stage's section); a bad package raises `error` (the stage's), naming it."""
    from transformer.core.sections.decode import DecodeConfig
    from transformer.model.checkpoint import CheckpointError
    from transformer.model.translator import DecodeError, load_translator

    decoding = DecodeConfig(**{k: getattr(cfg, k) for k in SEARCH})
    try:
        return load_translator(package / MODEL, package / TOKENIZER, decoding, cfg.precision)
    except (CheckpointError, DecodeError) as e:
        raise error(str(e)) from None


def used(package: Path, model_sha: str, meta: dict[str, Any]) -> dict[str, str]:
    """What a stage's metrics record of the package it translated with (`meta`: its
    tokenizer's)."""
    return {
        "path": str(package),
        "model_sha256": model_sha,
        "tokenizer_sha256": meta["tokenizer_sha256"],
        "direction": f"{meta['src_lang']}-{meta['tgt_lang']}",
    }


def read_chunks(path: Path, size: int) -> Iterator[list[str]]:
    """The file's lines (without "\\n"), `size` at a time."""
    with open(path, encoding="utf-8", newline="\n") as f:
        while chunk := [line.removesuffix("\n") for line in itertools.islice(f, size)]:
            yield chunk


def key(inputs: dict[str, Any]) -> str:
    """A chunk folder's name: a hash of everything its translations depend on (JSON-able)."""
    text = json.dumps({"format": FORMAT, **inputs}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def folder(chunks: Path, name: str) -> Path:
    """chunks/name, made; the folders of other inputs there removed (never resumed again)."""
    found = Path(chunks) / name
    for stale in Path(chunks).glob("*") if Path(chunks).is_dir() else ():
        if stale.is_dir() and stale != found:
            shutil.rmtree(stale)
    found.mkdir(parents=True, exist_ok=True)
    return found


def chunk(found: Path, i: int, suffix: str) -> Path:
    """The file of chunk i (its translations, one line each)."""
    return found / f"{i:06d}.{suffix}"


def translate(
    files: Sequence[Path],
    n_lines: int,
    found: Path,
    size: int,
    suffix: str,
    fn: Callable[[int, list[list[str]]], list[str]],
    desc: str,
) -> dict[str, Any]:
    """Translate files[0] chunk by chunk into `found` (the finished chunks skipped): fn(i, [the
    chunk's lines of each file]) gives chunk i's translations (files[1:]: line-aligned with
    files[0], e.g. its references). Counts and the speed of what was translated here."""
    remove_partial_writes(found, "*")  # what a kill mid-write left
    n_chunks = -(-n_lines // size)
    resumed = translated = lines_done = 0
    bar = tqdm(total=n_lines, desc=desc, unit=" lines", mininterval=1.0, disable=None)
    seconds = 0.0
    for i, parts in enumerate(zip(*(read_chunks(f, size) for f in files))):
        lines, path = parts[0], chunk(found, i, suffix)
        if path.is_file() and count_lines(path) == len(lines):
            resumed += 1
            bar.update(len(lines))
            continue
        t0 = time.perf_counter()
        out = fn(i, list(parts))
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
        log.info("%d of %d chunks were already translated (resumed from %s)", resumed, done, found)
    return {
        "chunks": done,
        "chunks_resumed": resumed,
        "chunks_translated": translated,
        "seconds": round(seconds, 2),
        "pairs_per_second": round(lines_done / seconds, 1) if seconds else None,
    }


def translations(found: Path, i: int, suffix: str) -> list[str]:
    """Chunk i's translations, one per line of its chunk."""
    return chunk(found, i, suffix).read_text(encoding="utf-8").split("\n")


def finish(chunks: Path, found: Path) -> None:
    """The chunks' folder removed once the output is whole (and `chunks` when left empty)."""
    shutil.rmtree(found)
    if Path(chunks).is_dir() and not any(Path(chunks).iterdir()):
        Path(chunks).rmdir()
