"""Monolingual parts: target-language text, one sentence a line, for back-translation.

Readers for a text file (local or a URL; gzip by its .gz suffix), WMT's News Crawl layout
(news.YEAR.LANG.shuffled.deduped(.gz), in a folder or under a base URL) and Hugging Face
`datasets` yield (line number within the part, text); a line that is not UTF-8 becomes a
BadText naming its file and line there. `clean_mono` streams the parts through the rules one
side of a train pair gets (download.clean: the normalisation, empty and length, the script and
language filters for the target language), then drops repeats and lines equal to a valid or
test reference, and writes the survivors to one file, counting each drop by reason.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
from tqdm import tqdm

from transformer.core.sections.download import (
    DownloadConfig,
    MonoSpec,
    SourceSpec,
    line_range,
    part_clean,
)
from transformer.data import wmt
from transformer.data.clean import Counts, HashSet, hashes, line_filter, normalize
from transformer.data.crawl import CrawlFilter, CrawlRunner
from transformer.data.sources import BadText, decoded, fetch_file, raw_lines, within
from transformer.data.wmt import SourceError

log = logging.getLogger("transformer.download")
NEWSCRAWL = re.compile(r"news\.(\d{4})\.([a-z]{2,3})\.shuffled\.deduped(\.gz)?")
CHUNK = 8192  # lines per dedup / filter step, as the download stage's pairs
MAX_LOGGED = 20  # invalid lines logged one by one per part; the rest are only counted

Line = tuple[int, "str | BadText | None"]


@dataclass
class MonoPart:
    """A named monolingual part; `open()` starts its stream (and any download)."""

    name: str
    open: Callable[[], Iterator[Line]]
    clean: dict = field(default_factory=dict)


def mono_parts(cfg: DownloadConfig) -> list[MonoPart]:
    """The parts of download.monolingual, each limited to its `lines` and `max_lines`."""
    parts = []
    for i, spec in enumerate(cfg.monolingual):
        key = f"download.monolingual[{i}]"
        if not spec.path:
            raise SourceError(f"{key}.path is empty: name the {spec.format} source")
        read = {"text": _text, "newscrawl": _newscrawl, "hf": _hf}[spec.format]
        first, last = line_range(spec.lines, f"{key}.lines")
        if spec.max_lines:
            last = min(last or math.inf, first + spec.max_lines - 1)
        stream = functools.partial(within, functools.partial(read, cfg, spec, key), first, last)
        parts.append(MonoPart(spec.name or _name(spec, cfg), stream, spec.clean))
    return parts


def _name(spec: MonoSpec, cfg: DownloadConfig) -> str:
    if spec.format == "hf":
        return f"hf:{spec.path}:{spec.hf_name}:{spec.hf_split}:{spec.hf_column}"
    name = spec.path.format(lang=cfg.tgt_lang).rstrip("/").rsplit("/", 1)[-1]
    return f"newscrawl:{name}" if spec.format == "newscrawl" else name


def _file_lines(path: Path) -> Iterator[Line]:
    """(line number, line without its end) of a file; a read failure names the line."""
    n = 0
    try:
        for n, raw in enumerate(raw_lines(path), 1):
            line = decoded(raw, path, n)
            yield n, line.rstrip("\r\n") if isinstance(line, str) else line
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise SourceError(f"{path}: read failed after line {n}: {e}") from None


def _text(cfg: DownloadConfig, spec: MonoSpec, key: str) -> Iterator[Line]:
    yield from _file_lines(fetch_file(cfg, spec.path.format(lang=cfg.tgt_lang), spec.sha256))


def _newscrawl(cfg: DownloadConfig, spec: MonoSpec, key: str) -> Iterator[Line]:
    """The years' files in order, numbered on across them; each fetched when its turn comes."""
    lang, base = cfg.tgt_lang, spec.path.format(lang=cfg.tgt_lang).rstrip("/")
    if wmt.is_url(base):
        if not spec.years:
            raise SourceError(f"{key}.years: a News Crawl URL ({base}) cannot be listed; name them")
        files = [f"{base}/news.{y}.{lang}.shuffled.deduped.gz" for y in spec.years]
    else:
        files = [str(p) for p in _local_years(Path(base), lang, spec.years, key)]
    before = 0  # lines of the earlier files
    for where in files:
        n = 0
        for n, line in _file_lines(fetch_file(cfg, where, "")):
            yield before + n, line
        before += n


def _local_years(folder: Path, lang: str, years: list[int], key: str) -> list[Path]:
    if not folder.is_dir():
        raise SourceError(f"{folder}: no such folder ({key}.path, the News Crawl layout)")
    found: dict[int, Path] = {}
    for p in sorted(folder.iterdir()):  # news.Y.L.shuffled.deduped before its .gz: .gz wins
        m = NEWSCRAWL.fullmatch(p.name)
        if m and m[2] == lang:
            found[int(m[1])] = p
    if not found:
        raise SourceError(
            f"{folder}: no news.YEAR.{lang}.shuffled.deduped(.gz) file ({key}: the News Crawl "
            "layout of data.statmt.org/news-crawl)"
        )
    missing = [y for y in years if y not in found]
    if missing:
        raise SourceError(
            f"{folder}/news.{missing[0]}.{lang}.shuffled.deduped(.gz): no such file "
            f"({key}.years; years there: {', '.join(map(str, sorted(found)))})"
        )
    return [found[y] for y in years or sorted(found)]


def _hf(cfg: DownloadConfig, spec: MonoSpec, key: str) -> Iterator[Line]:
    """Rows of a `datasets` split: a text column, or a translation column's target side."""
    import datasets

    where = f"hf dataset {spec.path} ({spec.hf_name or 'default'}, split {spec.hf_split})"
    try:
        ds = datasets.load_dataset(
            spec.path,
            spec.hf_name or None,
            split=spec.hf_split,
            revision=spec.hf_revision or None,
            cache_dir=cfg.hf_cache_dir or None,
        )
    except (ConnectionError, FileNotFoundError, ValueError, OSError) as e:
        raise SourceError(f"{where}: {e}") from e
    column = spec.hf_column
    if column not in ds.column_names:
        raise SourceError(
            f"{where}: no column {column!r} ({key}.hf_column; columns: {ds.column_names})"
        )
    n = 0
    for batch in ds.iter(batch_size=1000):
        for value in batch[column]:
            n += 1
            if isinstance(value, dict):  # a translation: its target-language side
                if cfg.tgt_lang not in value:
                    raise SourceError(
                        f"{where}: row {n}: no {cfg.tgt_lang!r} in {column} "
                        f"(languages there: {', '.join(value)})"
                    )
                value = value[cfg.tgt_lang]
            yield n, value if isinstance(value, str) else None


def clean_mono(
    cfg: DownloadConfig, evals_tgt: HashSet, out: IO[str]
) -> tuple[Counts, dict[str, dict]]:
    """Every monolingual part through the one-side rules into `out`; the totals and per part.
    `evals_tgt`: hashes of the valid / test references (normalised), which no line may equal."""
    total, per_part, seen = Counts(), {}, HashSet()
    for i, part in enumerate(mono_parts(cfg)):
        key = f"download.monolingual[{i}].clean"
        crawl = CrawlFilter(part_clean(cfg.clean, SourceSpec(clean=part.clean), key), cfg.tgt_lang)
        counts = Counts()
        with CrawlRunner(crawl, counts.dropped) as runner:
            for chunk in _lines(part, cfg, counts):
                for done in runner.put(chunk):
                    _flush(done, cfg, seen, evals_tgt, out, counts)
            for done in runner.put([], last=True):
                _flush(done, cfg, seen, evals_tgt, out, counts)
        per_part[part.name] = counts.as_dict()
        total.add(counts)
        log.info("monolingual: %s: kept %d of %d lines", part.name, counts.kept, counts.read)
    return total, per_part


def _lines(part: MonoPart, cfg: DownloadConfig, counts: Counts) -> Iterator[list[tuple[str]]]:
    """Chunks of the part's normalised lines (1-tuples) that pass the length rules."""
    cc, bad, chunk = cfg.clean, 0, []
    for n, text in tqdm(
        part.open(), desc=f"monolingual: {part.name}", unit=" lines", mininterval=1.0, leave=False
    ):
        counts.read += 1
        if isinstance(text, str):
            try:
                text.encode("utf-8")  # a lone surrogate from JSON / datasets is not text
            except UnicodeEncodeError as e:
                text = BadText(part.name, n, e.reason)
        if isinstance(text, BadText):
            bad += 1
            if bad <= MAX_LOGGED:
                log.warning("%s, line dropped", text)
            counts.dropped["invalid_utf8"] += 1
            continue
        if text is None:
            log.warning("%s: line %d: a value that is not text, dropped", part.name, n)
            counts.dropped["malformed"] += 1
            continue
        text = normalize(text, cc)
        reason = line_filter(text, cc)
        if reason:
            counts.dropped[reason] += 1
            continue
        chunk.append((text,))
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if bad > MAX_LOGGED:
        log.warning("%s: %d more invalid UTF-8 lines dropped", part.name, bad - MAX_LOGGED)
    yield chunk


def _flush(chunk, cfg: DownloadConfig, seen: HashSet, evals_tgt: HashSet, out, counts) -> None:
    """Drop repeats and eval references from a chunk of filtered lines; write the rest."""
    if not chunk:
        return
    cc, keep = cfg.clean, np.ones(len(chunk), dtype=bool)
    h = hashes([text for (text,) in chunk])
    if cc.drop_eval_overlap:  # a test reference in the training data, if only as a target
        overlap = evals_tgt.contains(h)
        counts.dropped["eval_overlap"] += int(overlap.sum())
        keep &= ~overlap
    if cc.dedup:
        fresh = np.zeros(len(chunk), dtype=bool)
        fresh[keep] = seen.add_new(h[keep])
        counts.dropped["duplicate"] += int((keep & ~fresh).sum())
        keep = fresh
    for (text,), k in zip(chunk, keep):
        if k:
            out.write(text + "\n")
    counts.kept += int(keep.sum())
