"""What each `score.drop_fraction` would drop of a noisy corpus (issue 81), without training:
the scored run of benchmarks/quality/noise_score.py scored again, every pair's cost kept, and
the injected pairs' kinds counted among each fraction's worst.

    python -m benchmarks.quality.drop_curve WORKDIR [--fractions 0.02 0.05 0.07 0.1 0.15]

WORKDIR is noise_score's (its `scored` run and `corpus`). The score stage runs again on the
scored run's data/raw with its helpers (data/helpers), dropping nothing (a threshold no cost
reaches) and listing every pair in WORKDIR/drop_curve/worst.tsv; the costs are the run's own
(the same models, the same batches). For each fraction: the cost at its edge, the misaligned
pairs among the dropped (of those the rule filters left), the clean pairs dropped, and the
other injected kinds. Writes WORKDIR/drop_curve/curve.{json,md}. Two scoring passes: under a
minute at the Multi30k preset's size on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml

from benchmarks.common import ROOT
from benchmarks.quality import noise_clean as nc
from benchmarks.quality.noise_score import kinds

FRACTIONS = (0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2)


def curve(costs: list[float], kind_of: list[str], fractions) -> list[dict]:
    """Per fraction: the pairs the worst `fraction` holds, by kind ('clean' for the rest)."""
    order = sorted(range(len(costs)), key=lambda i: -costs[i])  # as the score stage's drops
    total = Counter(kind_of)
    rows = []
    for f in fractions:
        n = int(f * len(costs))
        got = Counter(kind_of[i] for i in order[:n])
        rows.append(
            {
                "fraction": f,
                "dropped": n,
                "cost_at_edge": round(costs[order[n - 1]], 4) if n else None,
                "misaligned": got["misaligned"],
                "misaligned_of": total["misaligned"],
                "clean": got["clean"],
                "clean_of": total["clean"],
                "other_noise": n - got["misaligned"] - got["clean"],
            }
        )
    return rows


def rescore(scored: Path, out: Path) -> Path:
    """The score stage on the scored run's inputs, dropping nothing, every pair listed."""
    params = yaml.safe_load((scored / "params.yaml").read_text())
    params["score"].update(threshold=1e9, drop_fraction=0.0, worst=10**9, parts={})
    out.mkdir(parents=True, exist_ok=True)
    (out / "params.yaml").write_text(yaml.safe_dump(params))
    data = scored / "data"
    cmd = [sys.executable, "-m", "transformer.score", str(data / "raw"), str(data / "helpers")]
    cmd += [str(out / "corpus"), "--manifest", str(data / "metrics/download.json")]
    cmd += ["--worst", str(out / "worst.tsv"), "--params", str(out / "params.yaml")]
    subprocess.run(cmd, cwd=ROOT, check=True)
    return out / "worst.tsv"


def markdown(rows: list[dict]) -> str:
    head = "| fraction | cost at the edge | misaligned dropped | clean dropped | other noise |\n"
    head += "|---|---|---|---|---|\n"
    return head + "".join(
        f"| {r['fraction']:.2f} | {r['cost_at_edge']} | {r['misaligned']} of "
        f"{r['misaligned_of']} ({r['misaligned'] / r['misaligned_of']:.0%}) | {r['clean']} of "
        f"{r['clean_of']} ({r['clean'] / r['clean_of']:.1%}) | {r['other_noise']} |\n"
        for r in rows
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.drop_curve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("workdir", type=Path, help="noise_score's WORKDIR (its scored run)")
    ap.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    args = ap.parse_args(argv)
    work = args.workdir.resolve()
    scored = work / "scored"
    if not (scored / "data/helpers").is_dir():
        raise SystemExit(f"error: {scored}/data/helpers not found: run noise_score first")
    out = work / "drop_curve"
    rows = [line.split("\t") for line in nc.read(rescore(scored, out))[1:]]
    raw = scored / "data/raw"
    en, de = nc.read(raw / "train.en"), nc.read(raw / "train.de")
    injected = kinds(work / "corpus")
    lines = [int(r[4]) - 1 for r in rows]  # TSV column 5: the line of data/raw/train (1-based)
    kind_of = [injected.get((en[i], de[i]), "clean") for i in lines]
    result = curve([float(r[0]) for r in rows], kind_of, args.fractions)
    (out / "curve.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (out / "curve.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
