"""A WMT-shaped generated corpus: real word frequencies and sentence lengths, a rare-word tail.

Sentences are drawn from the word frequencies of ../shared/data (Multi30k, newstest2013, the WMT
sample), with 3% of the words replaced by random strings from a pool of rare words (1.5M per
language at WMT14 en-de's 4.5M pairs), so the number of distinct words (what a BPE trainer's
memory grows with) is WMT-like. Sentence lengths come from the same files, or (`wmt_lengths`)
from the WMT sample alone: 22.5 words on average, as WMT's training text. German sentences are
the English length +-2 words. Used by wmt_mirror.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from benchmarks.common import SHARED

DATA = SHARED / "data"
SOURCES = {
    "en": ["multi30k/train.en", "newstest2013/newstest2013.en", "wmt-sample/train.tok.en"],
    "de": ["multi30k/train.de", "newstest2013/newstest2013.de", "wmt-sample/train.tok.de"],
}
WMT_SAMPLE = "wmt-sample/train.tok.en"


def _lexicon(lang: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(words, probabilities, sentence lengths in words) from the real data of `lang`."""
    counts: collections.Counter = collections.Counter()
    lengths = []
    for rel in SOURCES[lang]:
        for line in (DATA / rel).read_text(encoding="utf-8").splitlines():
            words = line.split()
            counts.update(words)
            if words:
                lengths.append(len(words))
    words = np.array(list(counts), dtype=object)
    freq = np.array(list(counts.values()), dtype=np.float64)
    return words, freq / freq.sum(), np.array(lengths)


def _rare_pool(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random lowercase words of 4-11 letters: the long tail of a real corpus."""
    letters = rng.integers(ord("a"), ord("z") + 1, (n, 11), dtype=np.uint8)
    lens = rng.integers(4, 12, n)
    return np.array([row[:k].tobytes().decode() for row, k in zip(letters, lens)], dtype=object)


class Corpus:
    """A seeded stream of aligned English / German sentence blocks."""

    def __init__(self, seed: int = 0, rare: int = 1_500_000, wmt_lengths: bool = False):
        if not DATA.is_dir():
            raise SystemExit(f"error: {DATA} not found (../shared/data beside the repo)")
        self.rng = np.random.default_rng(seed)
        self.lex = {lang: _lexicon(lang) for lang in ("en", "de")}
        self.rare = {lang: _rare_pool(self.rng, rare) for lang in ("en", "de")}
        self.lengths = self.lex["en"][2]
        if wmt_lengths:
            text = (DATA / WMT_SAMPLE).read_text(encoding="utf-8").splitlines()
            self.lengths = np.array([n for n in map(len, map(str.split, text)) if n])

    def blocks(self, n: int, block: int = 100_000) -> Iterator[dict[str, list[str]]]:
        """n sentence pairs, in blocks of at most `block`: {"en": [...], "de": [...]}."""
        rng = self.rng
        for start in range(0, n, block):
            m = min(block, n - start)
            base = rng.choice(self.lengths, m)  # sentence lengths, in words
            out = {}
            for lang, (words, p, _) in self.lex.items():
                lens = np.maximum(1, base + rng.integers(-2, 3, m) * (lang == "de"))
                w = words[rng.choice(len(words), int(lens.sum()), p=p)]
                swap = rng.random(len(w)) < 0.03
                w[swap] = self.rare[lang][rng.integers(0, len(self.rare[lang]), int(swap.sum()))]
                ends = np.cumsum(lens)
                out[lang] = [" ".join(w[e - k : e]) for e, k in zip(ends, lens)]
            yield out


def make_corpus(out: Path, pairs: int, seed: int = 0, block: int = 100_000) -> Path:
    """Write out/train.{en,de} (`pairs` lines) and out/valid.{en,de} (3000 lines)."""
    if (out / "train.de").exists():
        with open(out / "train.de", "rb") as f:
            if sum(1 for _ in f) == pairs:
                return out
    out.mkdir(parents=True, exist_ok=True)
    corpus = Corpus(seed)
    for split, n in (("valid", 3000), ("train", pairs)):
        files = {lang: open(out / f"{split}.{lang}", "w", encoding="utf-8") for lang in corpus.lex}  # noqa: SIM115
        for lines in corpus.blocks(n, block):
            for lang, f in files.items():
                f.write("".join(s + "\n" for s in lines[lang]))
        for f in files.values():
            f.close()
    return out
