"""Filters for web-crawled pairs: language identification, copies, script ratio (issue 72).

Each is a switch in `CleanConfig` (or a part's own `clean:`) with its own drop reason. They run
after the length and ratio rules, cheapest first, so the language model sees only pairs that
every other rule kept. Language ID is py3langid (its model is in its wheel: offline), chosen by
accuracy on short lines (docs/experiments/2026-11-29-crawl-cleaning.md); a side is judged only
when it has `langid_min_words` words and another language reaches `langid_min_prob`, because
short lines of names and numbers ("Born 1958 in Obernberg am Inn / Austria .") are ambiguous.
"""

from __future__ import annotations

import collections
import functools
import multiprocessing
import os
import re
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Self

from transformer.core.sections.download import CleanConfig
from transformer.core.settings import ConfigError
from transformer.data.langid import BatchIdentifier, identifier

CRAWL_REASONS = ("wrong_language", "copy", "script")
_LATIN = "A-Za-z\u00aa\u00b5\u00ba\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff"
# the letters of each script, as regex classes; a language not listed counts every letter
_SCRIPTS = {
    "latin": _LATIN,
    "cyrillic": "\u0400-\u052f",
    "greek": "\u0370-\u03ff\u1f00-\u1fff",
    "arabic": "\u0600-\u06ff\u0750-\u077f",
    "hebrew": "\u0590-\u05ff",
    "devanagari": "\u0900-\u097f",
    "cjk": "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af",
}
_NOT_LATIN = {
    **dict.fromkeys(("ru", "uk", "bg", "be", "kk", "mk", "sr", "mn", "ky", "tg"), "cyrillic"),
    **dict.fromkeys(("ar", "fa", "ur", "ps"), "arabic"),
    **dict.fromkeys(("hi", "mr", "ne"), "devanagari"),
    **dict.fromkeys(("zh", "ja", "ko"), "cjk"),
    "el": "greek",
    "he": "hebrew",
}
# languages written in Latin letters (the rest of py3langid's that are not above are counted
# with every letter: a filter that knows less, never one that drops a good line)
_LATIN_CODES = (
    "af an az br bs ca cs cy da de en eo es et eu fi fo fr ga gl hr ht hu id is it jv la lb lt "
    "lv mg ms mt nb nl nn no oc pl pt qu ro rw se sk sl sq sv sw tl tr vo wa xh zu"
)
_LATIN_LANGS = frozenset(_LATIN_CODES.split())
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters: what a copy is compared on


@functools.cache
def _batch() -> BatchIdentifier:
    return BatchIdentifier()


def script_letters(lang: str) -> re.Pattern:
    """A pattern matching one letter of `lang`'s script (any letter for a language not known)."""
    script = _NOT_LATIN.get(lang) or ("latin" if lang in _LATIN_LANGS else None)
    return re.compile(f"[{_SCRIPTS[script]}]" if script else r"[^\W\d_]")


class CrawlFilter:
    """The crawl filters of one part: `reason(src, tgt)` names why a pair goes, or None. Given
    one language (a monolingual part of the target language), items are 1-tuples of text, and
    the filters that need both sides (copies) do not apply."""

    def __init__(self, cc: CleanConfig, *langs: str) -> None:
        self.cc, self.langs = cc, langs
        self.letters = tuple(script_letters(lang) for lang in self.langs)
        if cc.langid:
            known = set(identifier().labels)
            keys = ("src_lang", "tgt_lang") if len(langs) == 2 else ("tgt_lang",)
            for key, lang in zip(keys, self.langs):
                if lang not in known:
                    raise ConfigError(
                        f"download.{key}: {lang!r} is not a language py3langid knows, so "
                        "download.clean.langid cannot check it (switch it off for this pair)"
                    )

    @property
    def active(self) -> bool:
        return self.cc.langid or self.cc.copies or self.cc.script

    def reason(self, *texts: str) -> str | None:
        """The first crawl filter that rejects the normalised pair (or text), or None
        (py3langid's own classify, a line at a time: the reference `reasons` is tested against)."""
        reason = self.cheap_reason(*texts)
        if reason or not self.cc.langid:
            return reason
        wrong = any(self.wrong_language(text, side) for side, text in enumerate(texts))
        return "wrong_language" if wrong else None

    def reasons(self, pairs: list[tuple[str, ...]]) -> list[str | None]:
        """`reason` of each pair (or 1-tuple), with the language model run over all at once."""
        out = [self.cheap_reason(*pair) for pair in pairs]
        if self.cc.langid:
            judged = [
                (i, side, text)
                for i, (pair, reason) in enumerate(zip(pairs, out))
                if reason is None
                for side, text in enumerate(pair)
                if self.judged(text)
            ]
            found = _batch().classify([text for *_, text in judged]) if judged else []
            for (i, side, _), (lang, prob) in zip(judged, found):
                if self.wrong(lang, prob, side):
                    out[i] = "wrong_language"
        return out

    def cheap_reason(self, *texts: str) -> str | None:
        """Copies (a pair's), then script: the filters that need no language model."""
        cc = self.cc
        if cc.copies and len(texts) == 2 and is_copy(*texts, cc.copy_overlap):
            return "copy"
        if cc.script and any(
            script_ratio(text, letters) < cc.min_script_ratio
            for text, letters in zip(texts, self.letters)
        ):
            return "script"
        return None

    def judged(self, text: str) -> bool:
        """Whether `text` has words enough for its language to be judged."""
        return len(text.split()) >= self.cc.langid_min_words

    def wrong(self, lang: str, prob: float, side: int) -> bool:
        return lang != self.langs[side] and prob >= self.cc.langid_min_prob

    def wrong_language(self, text: str, side: int) -> bool:
        """Whether `text` is, with enough words and confidence, not in its side's language."""
        return self.judged(text) and self.wrong(*identifier().classify(text), side)


def words(text: str) -> set[str]:
    """The lowercased letter runs of `text`: digits, punctuation and spacing left out."""
    return set(_WORD.findall(text.lower()))


def is_copy(src: str, tgt: str, overlap: float) -> bool:
    """Source and target equal, or their word sets overlapping by Jaccard >= `overlap`.

    Sides without a letter (numbers, punctuation) are the script filter's, not copies."""
    a, b = words(src), words(tgt)
    if not a or not b:
        return False
    return len(a & b) >= overlap * len(a | b)


def script_ratio(text: str, letters: re.Pattern) -> float:
    """The share of `text`'s non-space characters that are letters of the expected script."""
    chars = len(text) - text.count(" ")
    return len(letters.findall(text)) / chars if chars else 0.0


PARALLEL_AFTER = 4 * 8192  # pairs of a part filtered in-process before workers take over
# the one process that reads and normalises the pairs is the limit beyond 2-3 workers (~52k
# pairs a second on a 2-core EPYC against ~26k a worker), and each holds torch and the model
MAX_WORKERS = 4
_worker: CrawlFilter | None = None


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one, as under taskset
    or a container's cpuset), else all of them."""
    if hasattr(os, "sched_getaffinity"):  # Linux
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _start_worker(cc: CleanConfig, langs: tuple[str, ...]) -> None:
    global _worker
    import torch

    torch.set_num_threads(1)  # one core a worker: the workers are the parallelism
    _worker = CrawlFilter(cc, *langs)


def _worker_reasons(pairs: list[tuple[str, str]]) -> list[str | None]:
    return _worker.reasons(pairs)


class CrawlRunner:
    """A part's crawl filters over chunks of pairs, chunks kept in order; each chunk's rejects
    are counted into `counts` (a Counter of reasons) and left out, unless `flag_only` (valid
    and test: counted, every pair kept).

    A large part (more than `after` pairs) is filtered in `workers` processes (default: the
    usable cores, at most MAX_WORKERS) while this one reads on: the filters cost ~4x the reading
    on the WMT14 crawl (docs/experiments/2026-11-29-rehearsal-filters.md). A small part stays
    in-process, since a worker's start (~2 s: Python, numpy, torch, the model) is more than its
    filtering. Spawned, never forked: a reader (Hugging Face `datasets`) may hold threads.
    """

    def __init__(
        self,
        crawl: CrawlFilter,
        counts: collections.Counter,
        flag_only: bool = False,
        workers: int | None = None,
        after: int = PARALLEL_AFTER,
    ) -> None:
        self.crawl, self.counts, self.flag_only = crawl, counts, flag_only
        self.seen, self.pool = 0, None
        cores = usable_cores()
        self.workers = min(cores, MAX_WORKERS) if workers is None else workers
        self.after = after
        self.pending: collections.deque = collections.deque()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind, *_) -> None:
        if self.pool is None:
            return
        if kind is not None:  # an error (a dead worker, a bad line, Ctrl-C): chunks in flight
            # are not waited for; the workers are ended, as a broken pool cannot do itself
            # (Python 3.14's terminate_workers(); `_processes` until then)
            for process in list((self.pool._processes or {}).values()):
                process.terminate()
        self.pool.shutdown(wait=kind is None, cancel_futures=True)

    def put(self, chunk: list, last: bool = False) -> Iterator[list]:
        """Hand over a chunk of pairs; yield the survivors of each chunk whose filtering is done,
        in order (of all chunks still pending when `last`)."""
        if not self.crawl.active:
            yield chunk
            return
        self.seen += len(chunk)
        if self.pool is None and self.workers > 1 and self.seen > self.after:
            spawn = multiprocessing.get_context("spawn")
            init = (self.crawl.cc, self.crawl.langs)
            self.pool = ProcessPoolExecutor(self.workers, spawn, _start_worker, init)
            for _ in range(self.workers):  # every worker started now: a pool that starts one
                self.pool.submit(int)  # later, after another died, can hang in shutdown
        if self.pool is None:
            yield self.apply(chunk, self.crawl.reasons(chunk))
            return
        try:  # a worker that died breaks the pool: seen at the next submit or result
            self.pending.append((chunk, self.pool.submit(_worker_reasons, chunk)))
            ready = []
            while self.pending and (last or len(self.pending) > 2 * self.workers):
                done, reasons = self.pending.popleft()
                ready.append((done, reasons.result()))
        except (BrokenProcessPool, OSError) as e:
            raise RuntimeError(
                "a crawl-filter worker process ended abruptly (killed, or out of memory?); "
                "the stage wrote nothing: run it again"
            ) from e
        for done, found in ready:
            yield self.apply(done, found)

    def apply(self, chunk: list, reasons: list[str | None]) -> list:
        """Count the rejects; the pairs that stay."""
        self.counts.update(r for r in reasons if r)
        if self.flag_only:
            return chunk
        return [pair for pair, r in zip(chunk, reasons) if not r]
