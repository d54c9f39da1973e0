"""The batched language ID and the crawl filters' worker processes give py3langid's own answers:
the same label for every line, the same decision for every pair, the same output files."""

import collections
import os
import signal

import pytest
from py3langid.langid import MODEL_FILE, LanguageIdentifier

from transformer.core.sections.download import CleanConfig
from transformer.data.crawl import CrawlFilter, CrawlRunner
from transformer.data.langid import BatchIdentifier

ALL = CleanConfig(langid=True, copies=True, script=True)
ODD = ["", " ", "12345 678", "!!!", "ÄÖÜ", "LOUD CAPITALS HERE", "中文 文本", "a" * 3000]


@pytest.fixture(scope="module")
def reference():
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def crawl_lines(shared_data, n: int) -> list[tuple[str, str]]:
    sides = [
        (shared_data / "wmt-sample" / f"train.tok.{lang}").read_text("utf-8").splitlines()[:n]
        for lang in ("en", "de")
    ]
    return list(zip(*sides))


def test_labels_and_probabilities_match_py3langid(shared_data, reference):
    pairs = crawl_lines(shared_data, 4000)
    texts = [t for pair in pairs for t in pair] + ODD
    ours = BatchIdentifier().classify(texts, budget=200_000, lines=700)  # many uneven batches
    theirs = [reference.classify(t) for t in texts]
    assert [lang for lang, _ in ours] == [lang for lang, _ in theirs]
    worst = max(abs(p - q) for (_, p), (_, q) in zip(ours, theirs))
    assert worst < 1e-4, worst
    assert BatchIdentifier().classify([]) == []


def test_batched_reasons_are_the_line_by_line_ones(shared_data):
    pairs = crawl_lines(shared_data, 3000)
    f = CrawlFilter(ALL, "en", "de")
    batched = f.reasons(pairs)
    assert batched == [f.reason(s, t) for s, t in pairs]
    assert batched.count("wrong_language") >= 3  # the sample's Croatian, Spanish, English-English


def test_workers_keep_order_and_counts(shared_data):
    """Chunks filtered in two spawned processes come back in order, counted as in-process."""
    pairs = crawl_lines(shared_data, 2000)
    chunks = [pairs[i : i + 300] for i in range(0, len(pairs), 300)]
    f = CrawlFilter(ALL, "en", "de")
    results = {}
    for workers, after in ((1, 0), (2, 500)):  # in-process; workers from the 3rd chunk on
        counts = collections.Counter()
        with CrawlRunner(f, counts, workers=workers, after=after) as runner:
            kept = [p for c in chunks for done in runner.put(c) for p in done]
            kept += [p for done in runner.put([], last=True) for p in done]
        assert (runner.pool is not None) == (workers == 2)
        results[workers] = kept, counts
    assert results[1] == results[2]
    kept, counts = results[1]
    assert len(kept) + sum(counts.values()) == len(pairs) and counts["wrong_language"] >= 2


def test_flag_only_keeps_every_pair(shared_data):
    pairs = crawl_lines(shared_data, 500)
    counts = collections.Counter()
    with CrawlRunner(CrawlFilter(ALL, "en", "de"), counts, flag_only=True) as runner:
        assert next(runner.put(pairs, last=True)) == pairs
    assert sum(counts.values()) >= 1


def test_a_killed_worker_stops_the_part_with_a_clear_error(shared_data):
    pairs = crawl_lines(shared_data, 600)
    counts = collections.Counter()
    with CrawlRunner(CrawlFilter(ALL, "en", "de"), counts, workers=2, after=0) as runner:
        list(runner.put(pairs[:300]))  # the pool started, this chunk in flight
        for pid in list(runner.pool._processes):  # the workers, killed as the OOM killer would
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="worker process ended abruptly"):
            list(runner.put(pairs[300:], last=True))
