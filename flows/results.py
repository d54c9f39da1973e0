"""Every experiment in one table, whatever the checkout's HEAD: recipe, BLEU, steps, training
time, the champion (`*`) and each promotion decision with its reason.

    python -m flows.results [PROJECT]     # or: make results

The experiments are the refs DVC saved them as (refs/exps: one per flow run, and any `dvc exp
run` by hand), so a new commit hides none of them, as `dvc exp show` on HEAD would. Each row's
scores, steps and seconds come from the metrics files dvc.yaml names (the evaluate and train
stages'), read by `dvc exp show --json` for the commits the experiments branched from; the
recipe from the experiment's commit message (flow runs write it there) or params.yaml's preset
header; the champion and the decisions from the registry's git tags (flows/registry.py).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from flows import registry
from flows.dag import Stage, read_dag
from flows.lineage import EVALUATE, PARENT, Snapshot, flatten
from transformer.metrics import KEYS

TRAIN = "train"  # dvc.yaml
PRESET = re.compile(r"^# Written by `python -m transformer\.config preset ([\w.-]+)`")
COLUMNS = ("", "experiment", "version", "parent", "recipe", "BLEU", "steps", "time", "decision")
NUMERIC = {"BLEU", "steps", "time"}


def experiments(project: Path) -> list[dict[str, str]]:
    """Every saved experiment, oldest first: its name, commit and baseline commit."""
    listing = Snapshot(project).git(
        "for-each-ref",
        "refs/exps",
        "--sort=committerdate",
        "--format=%(objectname) %(refname)",
    )
    out = []
    for line in listing.splitlines():
        commit, ref = line.split()
        parts = ref.split("/")  # refs/exps/ab/cdef.../name: the baseline's sha, split after 2
        if len(parts) >= 5 and parts[2] != "celery":
            out.append({"commit": commit, "name": parts[-1], "baseline": parts[2] + parts[3]})
    return out


def exp_show(project: Path, baselines: list[str]) -> dict[str, dict[str, Any]]:
    """{experiment commit: its `dvc exp show --json` entry} for the experiments of `baselines`."""
    if not baselines:
        return {}
    cmd = [sys.executable, "-m", "dvc", "exp", "show", "--json"]
    cmd += [a for b in sorted(set(baselines)) for a in ("--rev", b)]
    r = subprocess.run(cmd, cwd=project, capture_output=True, text=True, check=False)
    if r.returncode:
        raise SystemExit(f"error: `dvc exp show` in {project} failed:\n{r.stderr.strip()}")
    return {
        e["rev"]: e
        for base in json.loads(r.stdout or "[]")
        for group in base.get("experiments") or []
        for e in group.get("revs") or []
    }


def recipe(project: Path, commit: str) -> str:
    """The preset and overrides a flow run recorded in the commit message, else the preset
    named in params.yaml's header; "-" where neither says."""
    snap = Snapshot(project, commit)
    for line in snap.git("log", "-1", "--format=%B", commit).splitlines():
        if line.startswith("recipe: "):
            found = json.loads(line.removeprefix("recipe: "))
            return " ".join([found.get("preset") or "-", *(found.get("overrides") or [])])
    header = PRESET.match(snap.text("params.yaml") or "")
    return header.group(1) if header else "-"


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


def rows(project: Path) -> list[list[str]]:
    """One row per experiment, oldest first."""
    project = Path(project)
    exps = experiments(project)
    shown = exp_show(project, [e["baseline"] for e in exps])
    dag = read_dag(project)
    champion = registry.champion_commit(project) if exps else None
    versions = registry.versions(project) if exps else {}
    decided = registry.decisions(project) if exps else {}
    out = []
    for e in exps:
        entry = shown.get(e["commit"], {})
        scores, trained = metrics(entry, dag.get(EVALUATE)), metrics(entry, dag.get(TRAIN))
        cells = [
            "*" if e["commit"] == champion else "",
            e["name"],
            versions.get(e["commit"]),
            metrics(entry, dag.get(PARENT)).get("version"),  # a continued run's champion
            recipe(project, e["commit"]),
            number(scores.get(KEYS["bleu"])),  # exact keys: a failed run's row shows "-"
            trained.get("step"),
            duration(trained.get("train/seconds")),
            "; ".join(decided.get(e["commit"], [])),
        ]
        out.append(["-" if c is None else str(c) for c in cells])
    return out


def table(rows: list[list[str]]) -> str:
    """Aligned columns: text to the left, numbers to the right."""
    lines = [list(COLUMNS), *rows]
    width = [max(len(r[i]) for r in lines) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(
            c.rjust(w) if COLUMNS[i] in NUMERIC else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, width))
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
    args = parser.parse_args(argv)
    found = rows(args.project)
    print(table(found) if found else "no experiments yet (refs/exps is empty)")


if __name__ == "__main__":
    main()
