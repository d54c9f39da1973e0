"""Train a joint BPE on a generated WMT14-sized corpus (4.5M pairs); print wall time, peak RSS.

    python benchmarks/tokenizer_bench.py --workdir /tmp/tokshard_bench          # 4.5M, 37k BPE
    python benchmarks/tokenizer_bench.py --pairs 200000 --type wordpiece --vocab-size 32000

The corpus is written once to --workdir/raw (reused when present): sentences drawn from the
word frequencies of ../shared/data (Multi30k, newstest2013, WMT sample), with 3% of the words
replaced by random strings from a pool of 1.5M per language, so the number of distinct words
(what the trainer's memory grows with) is WMT-like. The stage runs in a fresh process, so
the printed peak RSS is its own.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
SOURCES = {
    "en": ["multi30k/train.en", "newstest2013/newstest2013.en", "wmt-sample/train.tok.en"],
    "de": ["multi30k/train.de", "newstest2013/newstest2013.de", "wmt-sample/train.tok.de"],
}


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


def make_corpus(out: Path, pairs: int, seed: int = 0, block: int = 100_000) -> Path:
    """Write out/train.{en,de} (`pairs` lines) and out/valid.{en,de} (3000 lines)."""
    if (out / "train.de").exists():
        with open(out / "train.de", "rb") as f:
            if sum(1 for _ in f) == pairs:
                return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lex = {lang: _lexicon(lang) for lang in ("en", "de")}
    rare = {lang: _rare_pool(rng, 1_500_000) for lang in ("en", "de")}
    for split, n in (("valid", 3000), ("train", pairs)):
        files = {lang: open(out / f"{split}.{lang}", "w", encoding="utf-8") for lang in lex}  # noqa: SIM115
        for start in range(0, n, block):
            m = min(block, n - start)
            base = rng.choice(lex["en"][2], m)  # sentence lengths, in words
            for lang, (words, p, _) in lex.items():
                lens = np.maximum(1, base + rng.integers(-2, 3, m) * (lang == "de"))
                w = words[rng.choice(len(words), int(lens.sum()), p=p)]
                swap = rng.random(len(w)) < 0.03
                w[swap] = rare[lang][rng.integers(0, len(rare[lang]), int(swap.sum()))]
                ends = np.cumsum(lens)
                files[lang].write(
                    "".join(" ".join(w[e - k : e]) + "\n" for e, k in zip(ends, lens))
                )
        for f in files.values():
            f.close()
    return out


def run_stage(args: list[str], cwd: Path) -> tuple[float, float, float]:
    """Run a stage CLI in a fresh process: (wall s, its CPU s, its peak RSS in GiB)."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"error: {' '.join(args)} failed with exit code {proc.returncode}")
    cpu = usage.ru_utime + usage.ru_stime  # tells contention apart on a shared machine
    return time.perf_counter() - t0, cpu, usage.ru_maxrss / 2**20  # ru_maxrss is in KiB


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/tokshard_bench"))
    p.add_argument("--pairs", type=int, default=4_500_000)
    p.add_argument("--type", default="bpe", choices=["bpe", "wordpiece"])
    p.add_argument("--vocab-size", type=int, default=37000)
    args = p.parse_args()
    if not DATA.is_dir():
        raise SystemExit(f"error: {DATA} not found (../shared/data beside the repo)")
    raw = args.workdir / f"raw_{args.pairs}"
    t0 = time.perf_counter()
    make_corpus(raw, args.pairs)
    size = sum(f.stat().st_size for f in raw.glob("train.*")) / 2**30
    print(f"corpus: {args.pairs} pairs, {size:.2f} GiB of text ({time.perf_counter() - t0:.0f} s)")
    params = args.workdir / f"params_{args.type}_{args.vocab_size}.yaml"
    params.write_text(f"tokenizer: {{type: {args.type}, vocab_size: {args.vocab_size}}}\n")
    out = args.workdir / f"tok_{args.type}_{args.vocab_size}_{args.pairs}"
    metrics = out.with_suffix(".json")
    wall, cpu, rss = run_stage(
        [
            "transformer.tokenizer",
            str(raw),
            str(out),
            "--params",
            str(params),
            "--metrics",
            str(metrics),
        ],
        ROOT,
    )
    m = json.loads(metrics.read_text())
    print(
        f"train {args.type} {m['vocab_size']}: wall {wall:.1f} s (CPU {cpu:.0f} s), "
        f"peak RSS {rss:.2f} GiB, "
        f"{args.pairs / wall:.0f} pairs/s"
    )
    for lang, s in m["valid"].items():
        print(
            f"  valid.{lang}: {s['mean_tokens']} tokens/sentence, "
            f"round trip {s['roundtrip_exact']:.2%}, <unk> {s['unk_share']:.2%}"
        )


if __name__ == "__main__":
    main()
