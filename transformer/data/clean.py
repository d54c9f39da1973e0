"""Streaming corpus cleaning: per-line normalisation, per-pair filters, compact dedup state.

Every filter is a switch in `CleanConfig` and every drop is counted by reason. Normalisation and
filters apply to train only (CleanConfig.eval_cleanup names what valid/test got when opted in), so
newstest2014 keeps all its 3003 sentences, byte for byte as sacreBLEU reads them, and BLEU
stays comparable with published numbers.
Dedup state is 8 bytes per kept pair (sorted numpy runs), not a set of strings, so 36M pairs
of WMT14 en-fr need ~300 MB for it rather than tens of GB.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from transformer.core.sections.download import CleanConfig
from transformer.data.crawl import CRAWL_REASONS

REASONS = (
    "invalid_utf8",
    "malformed",
    "empty",
    "too_short",
    "too_long",
    "ratio",
    "duplicate",
    "eval_overlap",
    *CRAWL_REASONS,  # transformer/data/crawl.py: wrong_language, copy, script
)
# Characters that str.splitlines() or a reader in text mode treats as line ends: they would
# break line alignment, so they always become spaces, whatever the config says ("\n" itself
# reaches here inside a JSONL or Hugging Face value).
_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAK_TABLE = {ord(c): " " for c in _BREAKS}
# C0 and C1 controls and DEL, except tab (whitespace, handled by the whitespace step).
_CONTROL_TABLE = {c: None for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c != 0x09}
_CONTROL_TABLE.update(_BREAK_TABLE)


@dataclass
class Counts:
    """Lines read, pairs kept and pairs dropped by reason, for one part or one split; in valid
    and test, the pairs each crawl filter would have dropped (`flagged`: counted, kept)."""

    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    flagged: Counter = field(default_factory=Counter)

    def add(self, other: Counts) -> None:
        self.read += other.read
        self.kept += other.kept
        self.dropped.update(other.dropped)
        self.flagged.update(other.flagged)

    def as_dict(self) -> dict:
        out = {
            "read": self.read,
            "kept": self.kept,
            "dropped": {r: self.dropped.get(r, 0) for r in REASONS},
        }
        if self.flagged:
            out["flagged"] = {r: self.flagged.get(r, 0) for r in CRAWL_REASONS}
        return out


def normalize(text: str, cfg: CleanConfig) -> str:
    """One side of a pair after the control, NFC and whitespace steps."""
    text = text.translate(_CONTROL_TABLE if cfg.remove_control else _BREAK_TABLE)
    if cfg.nfc and not unicodedata.is_normalized("NFC", text):  # the check is the fast path
        text = unicodedata.normalize("NFC", text)
    if cfg.normalize_whitespace:
        text = " ".join(text.split())  # unicode-aware: also no-break and ideographic spaces
    return text


def pair_filter(src: str, tgt: str, cfg: CleanConfig) -> str | None:
    """The reason to drop a normalised pair, or None to keep it."""
    if not src.strip() or not tgt.strip():
        return "empty"
    n_src, n_tgt = len(src.split()), len(tgt.split())
    if min(n_src, n_tgt) < cfg.min_words:
        return "too_short"
    if max(n_src, n_tgt) > cfg.max_words:
        return "too_long"
    # fairseq / Moses clean-corpus-n.perl: drop when either side is > ratio times the other
    if cfg.max_ratio > 0 and max(n_src, n_tgt) > cfg.max_ratio * min(n_src, n_tgt):
        return "ratio"
    return None


def line_filter(text: str, cfg: CleanConfig) -> str | None:
    """The reason to drop one normalised side on its own (a monolingual line), or None: the
    rules of pair_filter that need no other side."""
    if not text.strip():
        return "empty"
    n = len(text.split())
    if n < cfg.min_words:
        return "too_short"
    if n > cfg.max_words:
        return "too_long"
    return None


def hashes(texts: list[str]) -> np.ndarray:
    """64-bit blake2b of each text: (N,) uint64. Deterministic across runs, unlike hash()."""
    raw = b"".join(hashlib.blake2b(t.encode(), digest_size=8).digest() for t in texts)
    return np.frombuffer(raw, dtype=np.uint64)


class HashSet:
    """A set of uint64 hashes kept as sorted numpy runs, merged like a binary counter.

    8 bytes per member, O(log n) runs; lookups and inserts are vectorised over a chunk.
    """

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(r) for r in self.runs)

    def contains(self, h: np.ndarray) -> np.ndarray:
        """(N,) bool: which of `h` are members."""
        found = np.zeros(len(h), dtype=bool)
        for run in self.runs:
            i = np.minimum(np.searchsorted(run, h), len(run) - 1)
            found |= run[i] == h
        return found

    def add(self, h: np.ndarray) -> None:
        if len(h) == 0:
            return
        self.runs.append(np.sort(h))  # repeats are harmless: membership is all we ask
        while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
            last = self.runs.pop()
            merged = np.concatenate([self.runs[-1], last])  # peak: 2x the merged run, no more
            merged.sort(kind="stable")  # timsort: linear on two sorted runs
            self.runs[-1] = merged

    def add_new(self, h: np.ndarray) -> np.ndarray:
        """(N,) bool: True where h[i] is neither a member nor seen earlier in `h`; adds those."""
        _, first = np.unique(h, return_index=True)  # first occurrence within the chunk
        fresh = np.zeros(len(h), dtype=bool)
        fresh[first] = True
        fresh &= ~self.contains(h)
        self.add(h[fresh])
        return fresh
