"""Cleaning filters and the compact hash set."""

import numpy as np
import pytest

from transformer.core.sections.download import CleanConfig
from transformer.data.clean import Counts, HashSet, hashes, normalize, pair_filter


def test_normalize_steps():
    cfg = CleanConfig()
    assert normalize("Cafe\u0301", cfg) == "Café"  # NFC composes e + combining acute
    assert normalize("  a \t b\u00a0 c  ", cfg) == "a b c"
    assert normalize("a\x00b\x1bc\x7f\x85d", cfg) == "abc d"  # controls gone, NEL -> space
    off = CleanConfig(nfc=False, normalize_whitespace=False, remove_control=False)
    assert normalize("Cafe\u0301  x\x00", off) == "Cafe\u0301  x\x00"


@pytest.mark.parametrize("brk", ["\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"])
def test_line_breaks_never_survive(brk):
    off = CleanConfig(nfc=False, normalize_whitespace=False, remove_control=False)
    out = normalize(f"a{brk}b", off)
    assert len(out.splitlines()) == 1 and len(f"a{brk}b".splitlines()) == 2
    assert normalize(f"a{brk}b", CleanConfig()) == "a b"  # a space, not glued words


def test_pair_filter_reasons():
    cfg = CleanConfig(min_words=2, max_words=5, max_ratio=1.5)
    assert pair_filter("", "x y", cfg) == "empty"
    assert pair_filter("a", "b c", cfg) == "too_short"
    assert pair_filter("a b c d e f", "a b c", cfg) == "too_long"
    assert pair_filter("a b c d", "a b", cfg) == "ratio"  # 4 > 1.5 * 2
    assert pair_filter("a b c", "a b", cfg) is None  # 3 = 1.5 * 2 is kept
    assert pair_filter("a b c d", "a b", CleanConfig(max_ratio=0)) is None


def test_hashes_deterministic_and_distinct():
    h = hashes(["a", "b", "a"])
    assert h.dtype == np.uint64 and h[0] == h[2] and h[0] != h[1]
    assert hashes(["a"])[0] == h[0]


def test_hashset_matches_python_set():
    rng = np.random.default_rng(0)
    hs, ref = HashSet(), set()
    for _ in range(60):  # many chunks: exercises run merging
        chunk = rng.integers(0, 5000, size=rng.integers(1, 300)).astype(np.uint64)
        fresh = hs.add_new(chunk)
        expect = []
        for x in chunk.tolist():
            expect.append(x not in ref)
            ref.add(x)
        assert fresh.tolist() == expect
    assert len(hs) == len(ref)
    assert len(hs.runs) <= 12  # log-many sorted runs, not one per chunk
    probe = np.arange(0, 6000, dtype=np.uint64)
    assert hs.contains(probe).tolist() == [x in ref for x in range(6000)]


def test_counts_add_and_dict():
    a, b = Counts(read=3, kept=1), Counts(read=2, kept=2)
    a.dropped["empty"] += 2
    a.add(b)
    d = a.as_dict()
    assert (d["read"], d["kept"], d["dropped"]["empty"], d["dropped"]["ratio"]) == (5, 3, 2, 0)
