"""Language ID on short real sentences: py3langid, pycld2 and lingua compared for the download
stage's language filter (docs/experiments/2026-11-29-crawl-cleaning.md, its rule first).

    python -m benchmarks.quality.langid_choice [--data ../shared/data]

Accuracy on Multi30k's val and test_2016 lines in en, de and fr, plus every train line of at most
5 words, by length bucket (words 1-5, 6-10, 11+); each candidate's speed as a ratio to the
fastest, measured in the same run; the share of wmt-sample pairs with either side not
identified as its language. A candidate that is not installed is skipped, named.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import SHARED

LANGS = ("en", "de", "fr")
BUCKETS = ((1, 5), (6, 10), (11, 10**6))


def candidates() -> dict[str, Callable[[str], str]]:
    """name -> text -> ISO 639-1 code of the top language ("" when it abstains)."""
    out: dict[str, Callable[[str], str]] = {}
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        out["py3langid"] = lambda t: ident.classify(t)[0]
    except ImportError:
        print("py3langid: not installed, skipped")
    try:
        import pycld2

        def cld2(t: str) -> str:
            try:
                code = pycld2.detect(t)[2][0][1]
            except pycld2.error:  # bytes it refuses (controls): no answer
                return ""
            return "" if code == "un" else code

        out["pycld2"] = cld2
    except ImportError:
        print("pycld2: not installed, skipped")
    try:
        from lingua import LanguageDetectorBuilder

        det = LanguageDetectorBuilder.from_all_languages().build()

        def lingua(t: str) -> str:
            lang = det.detect_language_of(t)
            return lang.iso_code_639_1.name.lower() if lang else ""

        out["lingua"] = lingua
    except ImportError:
        print("lingua: not installed, skipped")
    return out


def labelled(data: Path) -> list[tuple[str, str]]:
    """(line, its language): Multi30k val + test_2016, and train lines of at most 5 words."""
    m = data / "multi30k"
    out = []
    for lang in LANGS:
        for name in ("val", "test_2016_flickr"):
            out += [(t, lang) for t in (m / f"{name}.{lang}").read_text().splitlines() if t]
        out += [
            (t, lang)
            for t in (m / f"train.{lang}").read_text().splitlines()
            if 0 < len(t.split()) <= 5
        ]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=SHARED / "data")
    args = parser.parse_args(argv)
    lines = labelled(args.data)
    ws = args.data / "wmt-sample"
    pairs = list(
        zip(
            (ws / "train.tok.en").read_text().splitlines(),
            (ws / "train.tok.de").read_text().splitlines(),
        )
    )
    print(f"{len(lines)} labelled lines; buckets (words): {[b for b in BUCKETS]}")
    seconds = {}
    for name, detect in candidates().items():
        t0 = time.perf_counter()
        got = [detect(t) for t, _ in lines]
        seconds[name] = time.perf_counter() - t0
        row = []
        for lo, hi in BUCKETS:
            idx = [i for i, (t, _) in enumerate(lines) if lo <= len(t.split()) <= hi]
            ok = sum(got[i] == lines[i][1] for i in idx)
            row.append(f"{lo}-{hi if hi < 10**6 else ''}: {100 * ok / len(idx):.2f}% of {len(idx)}")
        total = 100 * sum(g == lang for g, (_, lang) in zip(got, lines)) / len(lines)
        flagged = sum(detect(s) != "en" or detect(t) != "de" for s, t in pairs if s and t)
        print(f"{name}: {'; '.join(row)}; all {total:.2f}%")
        print(f"  wmt-sample: {flagged} of {len(pairs)} pairs with a side not en / de")
    fastest = min(seconds.values())
    for name, s in seconds.items():
        print(f"{name}: {len(lines) / s:,.0f} lines/s, {s / fastest:.2f}x the fastest's time")


if __name__ == "__main__":
    main()
