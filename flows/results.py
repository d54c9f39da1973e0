"""The experiments in a table a terminal can show: name, preset, BLEU, chrF, steps, training time.

`dvc exp show` prints every param and metric, some 240 columns that a terminal cuts to "…".
This reads its JSON (the workspace, HEAD and HEAD's experiments; --all-commits for every
commit's) and keeps what compares runs: the scores from the evaluate stage's metrics, the steps
and seconds from the train stage's (the files dvc.yaml names), and the preset from the header
`python -m transformer.config preset NAME` writes atop params.yaml.

    python -m flows.results [PROJECT] [--all-commits]     # or: make results
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from flows.dag import Stage, read_dag
from flows.lineage import EVALUATE, FIELDS, flatten, pick

TRAIN = "train"  # dvc.yaml
PRESET = re.compile(r"^# Written by `python -m transformer\.config preset ([\w.-]+)`")
COLUMNS = ("experiment", "preset", "BLEU", "chrF", "steps", "time")


def exp_show(project: Path, all_commits: bool = False) -> list[dict[str, Any]]:
    """`dvc exp show --json`: the workspace and commits, each with its experiments."""
    cmd = [sys.executable, "-m", "dvc", "exp", "show", "--json"]
    r = subprocess.run(
        cmd + (["--all-commits"] if all_commits else []),
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode:
        raise SystemExit(f"error: `dvc exp show` in {project} failed:\n{r.stderr.strip()}")
    return json.loads(r.stdout or "[]")


def preset(project: Path, rev: str) -> str | None:
    """The preset named in params.yaml's header at `rev` (the file on disk for the workspace)."""
    if rev == "workspace":
        path = project / "params.yaml"
        text = path.read_text() if path.exists() else ""
    else:
        text = subprocess.run(
            ["git", "show", f"{rev}:params.yaml"],
            cwd=project,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    found = PRESET.match(text)
    return found.group(1) if found else None


def metrics(entry: dict[str, Any], stage: Stage | None) -> dict[str, Any]:
    """The stage's metrics files as the experiment recorded them, merged and flattened."""
    recorded = (entry.get("data") or {}).get("metrics") or {}
    flat: dict[str, Any] = {}
    for path in stage.metrics if stage else ():
        flat.update(flatten((recorded.get(path) or {}).get("data") or {}))
    return flat


def duration(seconds: Any) -> str | None:
    if not isinstance(seconds, int | float):
        return None
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def number(x: Any) -> str | None:
    return f"{x:.2f}" if isinstance(x, int | float) else None


def row(project: Path, dag: dict[str, Stage], entry: dict[str, Any], name: str) -> list[str]:
    scores, trained = metrics(entry, dag.get(EVALUATE)), metrics(entry, dag.get(TRAIN))
    cells = [
        name,
        preset(project, entry["rev"]),
        number(pick(scores, FIELDS["bleu"][1])),
        number(pick(scores, FIELDS["chrf"][1])),
        pick(trained, ("step",)),
        duration(pick(trained, ("train/seconds",))),
    ]
    return ["-" if c is None else str(c) for c in cells]


def rows(project: Path, exps: list[dict[str, Any]]) -> list[list[str]]:
    """One row per commit (the workspace, a branch or a commit) and, indented, its experiments."""
    dag = read_dag(project)
    out = []
    for base in exps:
        rev = base["rev"]
        label = "workspace" if rev == "workspace" else f"{base.get('name') or ''} ({rev[:7]})"
        out.append(row(project, dag, base, label.strip()))
        for group in base.get("experiments") or []:
            for entry in group.get("revs") or []:
                out.append(row(project, dag, entry, "  " + (entry.get("name") or entry["rev"][:7])))
    return out


def table(rows: list[list[str]]) -> str:
    """Aligned columns: text to the left, numbers to the right."""
    lines = [list(COLUMNS), *rows]
    width = [max(len(r[i]) for r in lines) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, width))
        ).rstrip()
        for r in lines
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flows.results",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "project", nargs="?", type=Path, default=Path("."), help="the DVC project (default: here)"
    )
    parser.add_argument(
        "--all-commits",
        action="store_true",
        help="the experiments of every commit, not only HEAD's",
    )
    args = parser.parse_args(argv)
    print(table(rows(args.project, exp_show(args.project, args.all_commits))))


if __name__ == "__main__":
    main()
