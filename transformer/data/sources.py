"""Corpus sources as streams of (line number, src, tgt) records, one `Part` per SourceSpec.

Readers decode each line (a side that is not UTF-8 becomes a `BadText` naming its file and line,
for the download stage to drop from train and to stop on in valid/test) and yield None for a side
that a malformed line lacks. valid and test lines come out as sacreBLEU reads the same file:
a WMT SGM file through its fake-SGML rule, a text file through its plain-text rule (`rstrip()`).
Nothing here holds more than one line of a file.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import IO

from transformer.core.sections.download import DownloadConfig, SourceSpec, line_range
from transformer.data import wmt
from transformer.data.wmt import SourceError

log = logging.getLogger("transformer.download")
SPLITS = ("train", "valid", "test")
FORMATS = ("text", "sgm", "tsv", "jsonl", "hf")
HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
# sacreBLEU's fake-SGML rule (dataset/fake_sgml.py), applied to the decoded line as it does
SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")

__all__ = [
    "SPLITS",
    "BadText",
    "Part",
    "Record",
    "SourceError",
    "decoded",
    "fetch_file",
    "parts_for",
    "raw_lines",
    "within",
]


@dataclass(frozen=True)
class BadText:
    """A side that is not valid UTF-8 text: where it is (file or part, and line), and why."""

    where: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: line {self.line}: invalid UTF-8 ({self.reason})"


Side = "str | BadText | None"
Record = tuple[int, Side, Side]


@dataclass
class Part:
    """A named corpus part; `open()` starts the stream (and any download) when it is its turn."""

    name: str
    open: Callable[[], Iterator[Record]]
    clean: dict = field(default_factory=dict)  # its own crawl-filter settings (SourceSpec.clean)


def parts_for(cfg: DownloadConfig, split: str) -> list[Part]:
    """The parts that make up `split` under cfg.source."""
    if cfg.source == "synthetic":
        return [Part("synthetic", functools.partial(_synthetic, cfg, split))]
    unknown = [s for s in cfg.splits if s not in SPLITS]
    if unknown:
        raise SourceError(
            f"unknown split download.splits.{unknown[0]} (valid: {', '.join(SPLITS)})"
        )
    specs = cfg.splits.get(split) or []
    if cfg.source == "hf":
        specs = _hf_specs(cfg, split, specs)
    if not specs:
        raise SourceError(
            f"download.splits.{split} is empty: the {cfg.source} source needs its "
            "parts listed (see presets/multi30k-en-de.yaml, presets/wmt14-en-de-base.yaml)"
        )
    for i, spec in enumerate(specs):
        if spec.format not in FORMATS:
            raise SourceError(
                f"download.splits.{split}[{i}].format: unknown {spec.format!r} "
                f"(valid: {', '.join(FORMATS)})"
            )
        if spec.lines and spec.format == "sgm":
            raise SourceError(
                f"download.splits.{split}[{i}].lines: an sgm part is read whole (its "
                "documents are not lines)"
            )
    return [
        Part(
            _name(spec, cfg),
            functools.partial(
                within,
                functools.partial(_records, cfg, spec, split != "train"),
                *line_range(spec.lines, f"download.splits.{split}[{i}].lines"),
            ),
            spec.clean,
        )
        for i, spec in enumerate(specs)
    ]


def within(records: Callable[[], Iterator[tuple]], first: int, last: int | None) -> Iterator:
    """The records of `records()` numbered first..last (a part's `lines`); stops after last."""
    stream = records()
    try:
        for record in stream:
            if last is not None and record[0] > last:
                return
            if record[0] >= first:
                yield record
    finally:
        stream.close()  # its files, now rather than when collected


def _hf_specs(cfg: DownloadConfig, split: str, specs: list[SourceSpec]) -> list[SourceSpec]:
    """Under source hf, a split's hf parts; the wmt / local parts a preset lists do not apply,
    so `download.source: hf` alone switches a wmt14 preset to its Hub copy."""
    hf = [s for s in specs if s.format == "hf"]
    if len(hf) < len(specs):
        log.info(
            "download.source is hf: the %d non-hf part(s) in download.splits.%s do not "
            "apply; reading %s",
            len(specs) - len(hf),
            split,
            ", ".join(_name(s, cfg) for s in hf)
            or f"{cfg.hf_path} ({cfg.hf_name}, split {HF_SPLITS[split]})",
        )
    return hf or [SourceSpec(format="hf", hf_split=HF_SPLITS[split])]


def _name(spec: SourceSpec, cfg: DownloadConfig) -> str:
    if spec.name:
        return spec.name
    if spec.format == "hf":
        return f"hf:{spec.path or cfg.hf_path}:{cfg.hf_name}:{spec.hf_split}"
    return Path(spec.src or spec.path).name.replace(".{lang}", "").replace("{lang}", "*")


@functools.lru_cache(maxsize=1)
def _generate(seed: int, train: int, valid: int, test: int) -> dict:
    from transformer.core.sections.download import SyntheticConfig
    from transformer.data.synthetic import generate

    return generate(SyntheticConfig(train=train, valid=valid, test=test, seed=seed))


def _synthetic(cfg: DownloadConfig, split: str) -> Iterator[Record]:
    """The generated pairs, sides swapped for de -> en (DownloadConfig refuses other pairs):
    every split, valid and test too, holds the same pairs in either direction."""
    s = cfg.synthetic
    for i, (en, de) in enumerate(_generate(s.seed, s.train, s.valid, s.test)[split], 1):
        yield (i, en, de) if cfg.src_lang == "en" else (i, de, en)


# ----------------------------------------------------------------------------- files
def _records(cfg: DownloadConfig, spec: SourceSpec, evaluation: bool) -> Iterator[Record]:
    """`evaluation`: a valid / test part, whose text lines are read as sacreBLEU reads them."""
    if spec.format == "hf":
        yield from _hf(cfg, spec)
        return
    files = _locate(cfg, spec)
    if spec.format == "text":
        yield from _aligned(files, functools.partial(_text, plain=evaluation), "lines")
    elif spec.format == "sgm":
        yield from _aligned(files, _segments, "segments")
    elif spec.format == "tsv":
        yield from _tsv(files[0])
    else:
        yield from _jsonl(files[0], cfg.src_lang, cfg.tgt_lang)


def _locate(cfg: DownloadConfig, spec: SourceSpec) -> list[Path]:
    """Local paths of the part's files ([src, tgt], or [file] for tsv / jsonl), fetched if URLs."""
    langs = (cfg.src_lang, cfg.tgt_lang)
    two = spec.format in ("text", "sgm")
    if two:
        src = spec.src or spec.path
        names = [src.format(lang=langs[0]), (spec.tgt or src).format(lang=langs[1])]
    else:
        names = [spec.src or spec.path]
    archived = wmt.is_archive(spec.path)
    if archived and not (spec.src or (two and spec.tgt)):
        raise SourceError(f"{spec.path}: an archive part needs src (and tgt) member names")
    if not all(names):
        raise SourceError(f"a {spec.format} part needs path (or src and tgt): {spec}")
    if two and names[0] == names[1]:
        raise SourceError(
            f"{spec.path}: source and target are the same file; put {{lang}} in "
            f"{'src' if archived else 'it'}"
        )
    if archived:
        archive = fetch_file(cfg, spec.path, spec.sha256)
        return wmt.extract(
            archive, names, wmt.extraction_dir(archive, Path(cfg.cache_dir) / "extracted")
        )
    single = spec.sha256 if len(set(names)) == 1 or not two else ""
    return [fetch_file(cfg, n, single) for n in names]


def fetch_file(cfg: DownloadConfig, where: str, sha256: str) -> Path:
    """The local path of a part's file: downloaded (resumably, via download.mirror) if a URL."""
    if wmt.is_url(where):
        if cfg.mirror:
            where = wmt.mirrored(where, cfg.mirror)
        return wmt.fetch(
            where, Path(cfg.cache_dir) / "downloads", sha256, cfg.retries, cfg.backoff, cfg.timeout
        )
    path = Path(where)
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    if sha256:
        wmt.verify(path, sha256, str(path))
    return path


def _open(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def raw_lines(path: Path) -> Iterator[bytes]:
    with _open(path) as f:
        yield from f  # binary mode: lines end at b"\n" only, never at a stray \r or \x85


def decoded(raw: bytes, path: Path, n: int) -> str | BadText:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadText(str(path), n, e.reason)


def _text(path: Path, plain: bool = False) -> Iterator[tuple[int, str | BadText]]:
    """(line number, line) of a text file, without its line end. `plain`: also without trailing
    whitespace, as sacreBLEU's PlainTextDataset reads a test set (`line.rstrip()`)."""
    for n, raw in enumerate(raw_lines(path), 1):
        line = decoded(raw, path, n)
        if isinstance(line, str):
            line = line.rstrip() if plain else line.rstrip("\r\n")
        yield n, line


def _segments(path: Path) -> Iterator[tuple[int, str | BadText]]:
    """(line number, text) of each <seg> of a WMT (fake) SGM file, as sacreBLEU's
    FakeSGMLDataset extracts it: the lines that start with "<seg ", through SEG, then stripped
    and each run of whitespace made one space (Unicode whitespace: str.split)."""
    for n, raw in enumerate(raw_lines(path), 1):
        if not raw.startswith(b"<seg "):
            continue
        line = decoded(raw, path, n)
        if isinstance(line, str):
            text, found = SEG.subn(r"\1", line)
            if not found:  # sacreBLEU would keep the tag in the text
                raise SourceError(f"{path}: line {n}: <seg> without </seg> on the same line")
            line = " ".join(text.split())
        yield n, line


def _aligned(
    files: list[Path], read: Callable[[Path], Iterator[tuple[int, Side]]], unit: str
) -> Iterator[Record]:
    src, tgt = files
    n = 0
    try:
        for a, b in zip_longest(read(src), read(tgt)):
            if a is None or b is None:
                raise _mismatch(files, read, unit)  # recounts both: the error names both counts
            n = a[0]
            yield n, a[1], b[1]  # numbered by the source file's lines
    except (OSError, EOFError) as e:
        raise SourceError(f"{src} / {tgt}: read failed after line {n}: {e}") from e


def _mismatch(files: list[Path], read: Callable, unit: str) -> SourceError:
    n_src, n_tgt = (sum(1 for _ in read(f)) for f in files)
    return SourceError(
        f"parallel files differ in length: {files[0]} has {n_src} {unit}, "
        f"{files[1]} has {n_tgt}; nothing was written"
    )


def _tsv(path: Path) -> Iterator[Record]:
    for n, raw in enumerate(raw_lines(path), 1):
        line = decoded(raw, path, n)
        if isinstance(line, BadText):
            yield n, line, line
            continue
        cols = line.rstrip("\r\n").split("\t")
        if len(cols) == 2 or not line.strip():  # a blank line: counted as an empty pair
            yield n, cols[0], cols[-1]
        else:  # a missing or an extra column: which side is which cannot be known
            log.warning("%s: line %d: %d tab-separated columns, not 2; dropped", path, n, len(cols))
            yield n, None, None


def _jsonl(path: Path, src_lang: str, tgt_lang: str) -> Iterator[Record]:
    for n, line in enumerate(raw_lines(path), 1):
        text = decoded(line, path, n)
        if isinstance(text, BadText):
            yield n, text, text  # the stage drops it (train) or stops (valid / test)
            continue
        try:
            pair = json.loads(text)["translation"]
        except (ValueError, KeyError, TypeError):
            log.warning('%s: line %d: not {"translation": {...}} JSON, dropped', path, n)
            yield n, None, None
            continue
        missing = [lang for lang in (src_lang, tgt_lang) if lang not in pair]
        if missing:
            raise SourceError(
                f"{path}: line {n}: no {missing[0]!r} in translation "
                f"(languages there: {', '.join(pair)})"
            )
        yield n, pair[src_lang], pair[tgt_lang]


# ----------------------------------------------------------------------------- hugging face
def _hf(cfg: DownloadConfig, spec: SourceSpec) -> Iterator[Record]:
    """Rows of a `datasets` split with a `translation` column (Hub id or local Hub-layout copy)."""
    import datasets

    path, split = spec.path or cfg.hf_path, spec.hf_split or "train"
    where = f"{path} ({cfg.hf_name}, split {split}, revision {cfg.hf_revision or 'default'})"
    offline = any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
        for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )
    try:
        ds = datasets.load_dataset(
            path,
            cfg.hf_name or None,
            split=split,
            revision=cfg.hf_revision or None,
            cache_dir=cfg.hf_cache_dir or None,
        )
    except (ConnectionError, FileNotFoundError, ValueError, OSError) as e:
        hint = (
            " (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set and it is not cached: run once "
            "online, or set download.hf_path to a local copy)"
            if offline
            else ""
        )
        raise SourceError(f"hf dataset {where}: {e}{hint}") from e
    if "translation" not in ds.column_names:
        raise SourceError(f"hf dataset {where}: no translation column (has: {ds.column_names})")
    n = 0
    for batch in ds.iter(batch_size=1000):
        for pair in batch["translation"]:
            n += 1
            if n == 1 and not {cfg.src_lang, cfg.tgt_lang} <= set(pair):
                raise SourceError(
                    f"hf dataset {where}: no {cfg.src_lang}-{cfg.tgt_lang} pair "
                    f"(languages there: {', '.join(pair)})"
                )
            yield n, pair[cfg.src_lang], pair[cfg.tgt_lang]
