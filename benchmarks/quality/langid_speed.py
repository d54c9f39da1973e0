"""The crawl filters' language ID three ways, on real crawl lines: py3langid a line at a time (the
reference), batched in-process, and the download stage's worker processes.

    python -m benchmarks.quality.langid_speed [--data ../shared/data] [--repeat 10] [--workers N]

wmt-sample's 10,000 pairs (`--repeat` times over) through `CrawlFilter`: pairs/s of each way as a
ratio to the reference's, measured in the same run, and how many of the pairs' decisions differ
from the reference's (the batched product sums in another order, so a probability within float
rounding of `langid_min_prob` could flip; the count says whether any did). Run it on an idle
machine: the workers use every core.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from benchmarks.common import SHARED
from transformer.core.sections.download import CleanConfig
from transformer.data.crawl import MAX_WORKERS, CrawlFilter, CrawlRunner, usable_cores

CHUNK = 8192  # the download stage's chunk


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=SHARED / "data")
    parser.add_argument("--repeat", type=int, default=10, help="wmt-sample this many times over")
    parser.add_argument("--workers", type=int, default=min(usable_cores(), MAX_WORKERS))
    args = parser.parse_args(argv)
    ws = args.data / "wmt-sample"
    sides = [(ws / f"train.tok.{lang}").read_text("utf-8").splitlines() for lang in ("en", "de")]
    pairs = list(zip(*sides)) * args.repeat
    chunks = [pairs[i : i + CHUNK] for i in range(0, len(pairs), CHUNK)]
    f = CrawlFilter(CleanConfig(langid=True, copies=True, script=True), "en", "de")
    f.reasons(pairs[:100])  # the models loaded and warm before any clock starts
    f.reason(*pairs[0])

    def workers() -> list:
        counts = collections.Counter()
        with CrawlRunner(f, counts, workers=args.workers, after=0) as runner:
            out = [p for c in chunks for done in runner.put(c) for p in done]
            return out + [p for done in runner.put([], last=True) for p in done]

    reference, s_ref = timed(lambda: [f.reason(s, t) for s, t in pairs])
    batched, s_batch = timed(lambda: [r for c in chunks for r in f.reasons(c)])
    kept, s_pool = timed(workers)
    expected = [p for p, r in zip(pairs, reference) if not r]
    print(f"{len(pairs):,} pairs (wmt-sample x {args.repeat}); reference dropped "
          f"{sum(map(bool, reference)):,}: {collections.Counter(filter(None, reference))}")  # fmt: skip
    for name, s in (
        ("py3langid, a line at a time", s_ref),
        ("batched, in-process", s_batch),
        (f"batched, {args.workers} worker processes (their start included)", s_pool),
    ):
        print(f"{name}: {len(pairs) / s:,.0f} pairs/s, {s_ref / s:.2f}x the reference's speed")
    print(f"decisions differing from the reference: batched {sum(a != b for a, b in zip(batched, reference))}, "
          f"workers' kept pairs {'identical' if kept == expected else 'DIFFERENT'}")  # fmt: skip


if __name__ == "__main__":
    main()
