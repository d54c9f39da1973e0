"""Stream a generated N-pair corpus through the download stage; print pairs/s and peak RSS.

    python benchmarks/download_bench.py --pairs 1000000 5000000 --workdir /tmp/download_bench

Each size runs in a fresh process, so its peak RSS is its own. The corpus (random words,
~2% duplicate pairs, some empty lines, a few ratio outliers) is written once to --workdir.
Goal (issue 3): peak RSS < 1 GiB and flat between 1M and 5M pairs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def generate(prefix: Path, n: int, seed: int = 0) -> None:
    """prefix.en / prefix.de with n line-aligned pairs, in blocks (constant memory)."""
    if prefix.with_suffix(".de").exists():
        return
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(20000)])
    tmp = [prefix.with_suffix(f".{lang}.tmp") for lang in ("en", "de")]
    prev = ("a", "b")
    with open(tmp[0], "w") as fe, open(tmp[1], "w") as fd:
        for start in range(0, n, 100_000):
            m = min(100_000, n - start)
            lens = rng.integers(3, 30, size=m)
            for i in range(m):
                k = lens[i]
                en = " ".join(vocab[rng.integers(0, 20000, size=k)])
                de = " ".join(vocab[rng.integers(0, 20000, size=max(1, k + rng.integers(-3, 4)))])
                if i % 50 == 7:  # a duplicate of the previous pair
                    en, de = prev
                if i % 997 == 3:
                    en = ""
                prev = en, de
                fe.write(en + "\n")
                fd.write(de + "\n")
    for t in tmp:
        t.rename(t.with_suffix(""))


def run(prefix: Path, eval_prefix: Path, out: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from transformer.download import download
    from transformer.sections.download import DownloadConfig, SourceSpec

    cfg = DownloadConfig(
        source="local",
        splits={
            "train": [SourceSpec(path=f"{prefix}.{{lang}}")],
            "valid": [SourceSpec(path=f"{eval_prefix}.{{lang}}")],
            "test": [SourceSpec(path=f"{eval_prefix}.{{lang}}")],
        },
    )
    t0 = time.perf_counter()
    m = download(cfg, out)
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux -> MiB
    t = m["splits"]["train"]
    return {
        "pairs": t["read"],
        "kept": t["kept"],
        "seconds": round(dt, 1),
        "pairs_per_s": round(t["read"] / dt),
        "peak_rss_mib": round(peak),
        "dropped": {k: v for k, v in t["dropped"].items() if v},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/download_bench"))
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)  # child: one measurement
    args = parser.parse_args(argv)
    w = args.workdir
    if args.run:
        out = run(w / f"corpus{args.run}", w / "eval", w / f"out{args.run}")
        print(json.dumps(out))
        return
    w.mkdir(parents=True, exist_ok=True)
    generate(w / "eval", 3000, seed=1)
    for n in args.pairs:
        generate(w / f"corpus{n}", n)
        r = subprocess.run(
            [sys.executable, __file__, "--workdir", str(w), "--run", str(n)],
            check=True,
            capture_output=True,
            text=True,
        )
        res = json.loads(r.stdout.strip().splitlines()[-1])
        print(
            f"{n:>9,} pairs: {res['pairs_per_s']:>8,} pairs/s  ({res['seconds']} s)  "
            f"peak RSS {res['peak_rss_mib']} MiB  kept {res['kept']:,}  dropped {res['dropped']}"
        )


if __name__ == "__main__":
    main()
