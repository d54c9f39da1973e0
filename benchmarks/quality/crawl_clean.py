"""What each crawl filter (language ID, copies, script ratio) removes from a real noisy sample,
with pairs drawn for checking by hand (docs/experiments/2026-11-29-crawl-cleaning.md).

    python -m benchmarks.quality.crawl_clean OUT_DIR [--data ../shared/data] [--sample 50]
        [--set langid_min_prob=0.5 ...]

Reads wmt-sample (10k WMT en-de pairs), normalises each pair and applies the length and ratio
rules as the download stage does, then asks every crawl filter alone for its decision. Prints
each filter's count, the union's and their overlaps; writes OUT_DIR/removed.tsv (every removed
pair, its line and the filters that removed it) and OUT_DIR/sample.tsv (`--sample` removed and
`--sample` kept pairs drawn with a fixed seed, shuffled together, for judging blind).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from collections import Counter
from pathlib import Path

from benchmarks.common import SHARED
from transformer.core.sections.download import CleanConfig
from transformer.data.clean import normalize, pair_filter
from transformer.data.crawl import CRAWL_REASONS, CrawlFilter

ON = {"langid": True, "copies": True, "script": True}
SWITCH = {"wrong_language": "langid", "copy": "copies", "script": "script"}


def decisions(pairs: list[tuple[str, str]], cc: CleanConfig) -> list[list[str]]:
    """For each pair, the crawl filters that reject it (each asked alone); [] if kept. Pairs
    that the length and ratio rules drop get ["rules"]."""
    only = {
        r: CrawlFilter(
            dataclasses.replace(cc, **{**dict.fromkeys(ON, False), SWITCH[r]: True}), "en", "de"
        )
        for r in CRAWL_REASONS
    }
    out = []
    for s, t in pairs:
        s, t = normalize(s, cc), normalize(t, cc)
        if pair_filter(s, t, cc):
            out.append(["rules"])
            continue
        out.append([r for r, f in only.items() if f.reason(s, t)])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--data", type=Path, default=SHARED / "data")
    parser.add_argument("--sample", type=int, default=50)
    parser.add_argument("--set", nargs="*", default=[], help="download.clean KEY=VALUE")
    args = parser.parse_args(argv)
    sets = {k: float(v) if "." in v else int(v) for k, v in (x.split("=") for x in args.set)}
    cc = CleanConfig(**{**ON, **sets})
    ws = args.data / "wmt-sample"
    en = (ws / "train.tok.en").read_text(encoding="utf-8").splitlines()
    de = (ws / "train.tok.de").read_text(encoding="utf-8").splitlines()
    pairs = list(zip(en, de))
    got = decisions(pairs, cc)
    count = Counter(r for d in got for r in d)
    judged = sum(d != ["rules"] for d in got)
    removed = [i for i, d in enumerate(got) if d and d != ["rules"]]
    print(f"{len(pairs)} pairs; {judged} past the length and ratio rules; settings {sets}")
    for r in CRAWL_REASONS:
        print(f"  {r}: {count[r]} ({100 * count[r] / judged:.2f}%)")
    print(f"  any crawl filter: {len(removed)} ({100 * len(removed) / judged:.2f}%)")
    print(f"  overlaps: {Counter('+'.join(got[i]) for i in removed if len(got[i]) > 1)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with open(args.out_dir / "removed.tsv", "w", encoding="utf-8") as f:
        f.writelines(f"{i + 1}\t{'+'.join(got[i])}\t{en[i]}\t{de[i]}\n" for i in removed)
    rng = random.Random(72)
    kept = [i for i, d in enumerate(got) if not d]
    drawn = [(i, "removed") for i in rng.sample(removed, min(args.sample, len(removed)))]
    drawn += [(i, "kept") for i in rng.sample(kept, args.sample)]
    rng.shuffle(drawn)
    with open(args.out_dir / "sample.tsv", "w", encoding="utf-8") as f:
        f.writelines(
            f"{i + 1}\t{what}\t{'+'.join(got[i])}\t{en[i]}\t{de[i]}\n" for i, what in drawn
        )
    print(f"wrote {args.out_dir / 'removed.tsv'} and {args.out_dir / 'sample.tsv'}")


if __name__ == "__main__":
    main()
