"""Training curves for the tests: dvclive's metrics files as the train stage writes them, and the
points an SVG picture draws of each."""

from __future__ import annotations

import re
from pathlib import Path


def write_live(plots: Path, steps: int = 40, every: int = 10) -> Path:
    """dvclive's plots/metrics files as the train stage writes them (timestamp, step, value)."""
    cols = {"train/loss": range(1, steps + 1)}
    for name in ("valid/loss", "valid/bleu", "valid/chrf"):
        cols[name] = range(every, steps + 1, every)
    for name, rows in cols.items():
        f = plots / f"{name}.tsv"
        f.parent.mkdir(parents=True, exist_ok=True)
        field = name.split("/")[1]
        f.write_text(
            f"timestamp\tstep\t{field}\n" + "".join(f"0\t{s}\t{100 / s:.4f}\n" for s in rows)
        )
    return plots


def line_points(svg: str, filename: str) -> list[int]:
    """The vertex counts of the SVG's lines drawn from `filename` (Vega labels each line)."""
    return [
        len(re.findall(r"[ML]", d))
        for label, d in re.findall(r'<path aria-label="([^"]*)"[^>]*\sd="([^"]*)"', svg)
        if f"filename: {filename}" in label or f"filename::field: {filename}" in label
    ]
