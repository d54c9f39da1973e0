"""Pool several draws of a share benchmark (bt_halves, noise_score) into one decision.

    python -m benchmarks.quality.pool RESULTS.json [RESULTS.json ...] --low a --high ab
        --mid bt-beam --target 0.5 [--edge 0.7]

One sitting of bt_halves or noise_score is a single draw of each run: a time-bounded run's
update count and order move test BLEU by ~1 BLEU between sittings (docs/experiments/
2026-12-02-noise-score-20min-helpers.md), which the test set's paired bootstrap does not see.
This reads each sitting's results file (their `runs.NAME.bleu`), takes each run's mean over
the sittings, and decides the issue's share, `(mid - low) / (high - low) >= target`, against
the line `low + target * (high - low)` of the means: met if `mid` is at least `--edge` BLEU above
it, not met if at least `--edge` below, otherwise at the edge. `--edge` defaults to 1 BLEU over
the square root of the number of sittings (the standard error of a mean of n draws).

A run with the same figure in two sittings is an error: it is one run counted twice (a sitting
whose runs were copied from another, as noise_score's helpers and filtered run are), which would
shrink the edge without adding a draw. `--allow-repeats` pools them anyway (two draws that tie).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def pool(
    draws: list[dict[str, float]],
    low: str,
    mid: str,
    high: str,
    target: float,
    edge: float | None = None,
    allow_repeats: bool = False,
) -> dict:
    """The pooled decision over `draws`, each a run name -> test BLEU mapping of one sitting."""
    if not draws:
        raise ValueError("no sittings to pool")
    for i, draw in enumerate(draws, 1):
        missing = [r for r in (low, mid, high) if r not in draw]
        if missing:
            raise ValueError(f"sitting {i} has no run {', '.join(missing)}")
    if not allow_repeats:
        _refuse_repeats(draws, (low, mid, high))
    mean = {r: statistics.fmean(d[r] for d in draws) for r in (low, mid, high)}
    gap = mean[high] - mean[low]
    if gap <= 0:
        raise ValueError(f"{high} is not above {low} on the mean ({gap:+.2f} BLEU): no share")
    edge = 1.0 / math.sqrt(len(draws)) if edge is None else edge
    line = mean[low] + target * gap
    margin = mean[mid] - line
    verdict = "met" if margin >= edge else "not met" if margin <= -edge else "at the edge"
    return {
        "sittings": len(draws),
        "mean": {r: round(v, 2) for r, v in mean.items()},
        "shares": [share(d[low], d[mid], d[high]) for d in draws],
        "share": share(mean[low], mean[mid], mean[high]),
        "line": round(line, 2),
        "margin": round(margin, 2),
        "edge": round(edge, 2),
        "verdict": verdict,
    }


def _refuse_repeats(draws: list[dict[str, float]], runs: tuple[str, ...]) -> None:
    for run in runs:
        seen: dict[float, int] = {}
        for i, draw in enumerate(draws, 1):
            if draw[run] in seen:
                raise ValueError(
                    f"run {run} has the same BLEU ({draw[run]}) in sittings {seen[draw[run]]} "
                    f"and {i}: one run counted twice? (--allow-repeats if they are two draws)"
                )
            seen[draw[run]] = i


def share(low: float, mid: float, high: float) -> float | None:
    """`(mid - low) / (high - low)`, what `mid` wins of the gap; None where there is no gap."""
    return None if high == low else round((mid - low) / (high - low), 3)


def bleus(path: Path) -> dict[str, float]:
    """A results file's run name -> test BLEU."""
    try:
        runs = json.loads(path.read_text())["runs"]
        return {name: float(run["bleu"]) for name, run in runs.items() if "bleu" in run}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"error: {path}: not a results file with runs.NAME.bleu ({e})") from e


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.pool",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("results", type=Path, nargs="+", help="each sitting's results JSON")
    ap.add_argument("--low", required=True, help="the run the share starts from (a, noisy)")
    ap.add_argument("--mid", required=True, help="the run judged (bt-beam, scored)")
    ap.add_argument("--high", required=True, help="the run the share ends at (ab, oracle)")
    ap.add_argument("--target", type=float, required=True, help="the share asked (0.5, 0.9)")
    ap.add_argument("--edge", type=float, help="BLEU either side of the line that decides")
    ap.add_argument(
        "--allow-repeats", action="store_true", help="pool a run's equal figures as two draws"
    )
    args = ap.parse_args(argv)
    try:
        out = pool(
            [bleus(p) for p in args.results],
            args.low,
            args.mid,
            args.high,
            args.target,
            args.edge,
            args.allow_repeats,
        )
    except ValueError as e:
        raise SystemExit(f"error: {e}") from e
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
