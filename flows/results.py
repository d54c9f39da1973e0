"""Every experiment and every promotion decision in one table, whatever the checkout's HEAD:
BLEU, steps, training time, the champion (`*`), each decision with its reason, and the runs that
failed before they saved an experiment.

    python -m flows.results [PROJECT]            # or: make results; fits 120 columns
    python -m flows.results [PROJECT] --wide     # with the recipe, the parent, how it trained
                                                 # (the update path: eager, captured, compiled),
                                                 # the other lines' champions it used, and a
                                                 # student's BLEU gap and speed-up (its race)
    python -m flows.results [PROJECT] --line NAME  # one line's runs (flows/lines.py)

A project of several lines gets one table per line, each marking its own champion: a run's line
is the one its flow run recorded, or the line whose decision judged it; the runs of no line
(`dvc exp run` by hand, not yet through `python -m flows.promote --line`) and the failed runs
follow in a table of their own.

The experiments are the refs DVC saved them as (refs/exps: one per flow run, and any `dvc exp
run` by hand), so a new commit hides none of them, as `dvc exp show` on HEAD would. Each row's
scores, steps and seconds come from the metrics files dvc.yaml names (the evaluate and train
stages'), read by `dvc exp show --json` for the commits the experiments branched from; the
recipe from the experiment's commit message (flow runs write it there) or params.yaml's preset
header; the champion and the decisions from the registry's git tags (flows/registry.py), which a
clone has even where it lacks the experiments (`git clone` fetches tags, not refs/exps): their
rows come from the tags alone, and the table says how to fetch the rest. Failed runs come from
the Prefect server (PREFECT_API_URL), the flow runs of this project's deployments that ended
Failed or Crashed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from flows import distilled, failed, lines, registry
from flows.dag import Stage, read_dag
from flows.lineage import EVALUATE, HELPERS, PARENT, TRAIN, Snapshot, flatten, used
from transformer.core.metrics import KEYS

PRESET = re.compile(r"^# Written by `python -m transformer\.config preset ([\w.-]+)`")
COLUMNS = ("", "experiment", "version", "parent", "recipe", "BLEU", "steps", "time", "decision")
WIDE = (*COLUMNS, "trained", "helpers", "student")  # the champions it used; gap and speed-up
NARROW = ("", "experiment", "version", "BLEU", "steps", "time", "decision")
NUMERIC = {"BLEU", "steps", "time"}
WIDTH = 120  # the narrow table's: its decision column is cut to fit
FETCH = "dvc exp pull origin --all-commits --no-cache"  # the experiments, which a clone lacks


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


def recorded(project: Path, commit: str) -> dict[str, Any]:
    """The recipe (preset, overrides, line) a flow run recorded in the commit message, or {}."""
    for line in Snapshot(project, commit).git("log", "-1", "--format=%B", commit).splitlines():
        if line.startswith("recipe: "):
            return json.loads(line.removeprefix("recipe: "))
    return {}


def recipe(project: Path, commit: str) -> str:
    """The preset and overrides a flow run recorded in the commit message, else the preset
    named in params.yaml's header; "-" where neither says."""
    if found := recorded(project, commit):
        return " ".join([found.get("preset") or "-", *(found.get("overrides") or [])])
    header = PRESET.match(Snapshot(project, commit).text("params.yaml") or "")
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


def line_names(project: Path) -> list[str]:
    return [x.name for x in lines.read(Path(project))]


def of_line(project: Path, exps: list[dict[str, str]], line: str | None) -> list[dict[str, str]]:
    """The experiments of line `line` (None: of no line): those whose run recorded it, those
    its decisions judged, and in a project of one line those that recorded none."""
    names = line_names(project)
    decided = {d["commit"]: n for n in names for d in registry.decision_tags(project, n)}
    out = []
    for e in exps:
        theirs = recorded(project, e["commit"]).get("line") or decided.get(e["commit"])
        if theirs is None and len(names) == 1:
            theirs = names[0]
        if theirs == line:
            out.append(e)
    return out


def rows(project: Path, line: str | None = None, failed: bool = True) -> list[list[str]]:
    """One row per experiment of line `line` (the only line's when None; WIDE's columns),
    oldest first, then one per decision whose experiment this clone lacks, then the failed runs
    (unless `failed` is False)."""
    project = Path(project)
    line, _ = registry.artifact(project, line)
    exps = of_line(project, experiments(project), line)
    shown = exp_show(project, [e["baseline"] for e in exps])
    dag = read_dag(project)
    tags = registry.decision_tags(project, line)
    champion = registry.champion_commit(project, line) if exps or tags else None
    versions = registry.versions(project, line) if exps or tags else {}
    decided: dict[str, list[dict[str, Any]]] = {}
    for d in tags:
        decided.setdefault(d["commit"], []).append(d)
    out = []
    for e in exps:
        entry = shown.get(e["commit"], {})
        scores, trained = metrics(entry, dag.get(EVALUATE)), metrics(entry, dag.get(TRAIN))
        seconds, began = own_time(trained, e["name"])
        ds = decided.pop(e["commit"], [])
        bleu = scores.get(KEYS["bleu"])  # exact keys: a failed run's row shows "-"
        if bleu is None and ds:  # its cached metrics not fetched: the BLEU its decision recorded
            bleu = (ds[-1].get("candidate") or {}).get("bleu")
        out.append(
            row(
                e["commit"] == champion,
                e["name"],
                versions.get(e["commit"]),
                metrics(entry, dag.get(PARENT)).get("version"),  # a continued run's champion
                recipe(project, e["commit"]),
                bleu,
                trained.get("step"),
                seconds,
                ds,
                began,
                update_used(trained),
                used(metrics(entry, dag.get(HELPERS))),
                distilled.said(metrics(entry, dag.get(distilled.RACE))),
            )
        )
    for commit, ds in decided.items():  # decisions on experiments this clone does not have
        cand = ds[-1].get("candidate") or {}
        name = cand.get("experiment") or commit[:9]
        out.append(
            row(
                commit == champion,
                name,
                versions.get(commit),
                None,
                recipe(project, commit),
                cand.get("bleu"),
                None,
                None,
                ds,
            )
        )
    return out + (failed_runs(project) if failed else [])


def unassigned(project: Path) -> list[list[str]]:
    """A row per experiment of no line (run by hand, not yet gated), then the failed runs."""
    exps = of_line(project, experiments(project), None)
    shown = exp_show(project, [e["baseline"] for e in exps])
    dag = read_dag(project)
    out = []
    for e in exps:
        entry = shown.get(e["commit"], {})
        scores, trained = metrics(entry, dag.get(EVALUATE)), metrics(entry, dag.get(TRAIN))
        seconds, began = own_time(trained, e["name"])
        out.append(
            row(
                False,
                e["name"],
                None,
                metrics(entry, dag.get(PARENT)).get("version"),
                recipe(project, e["commit"]),
                scores.get(KEYS["bleu"]),
                trained.get("step"),
                seconds,
                [],
                began,
                use=used(metrics(entry, dag.get(HELPERS))),
            )
        )
    return out + failed_runs(project)


def own_time(trained: dict[str, Any], name: str) -> tuple[Any, str | None]:
    """The run's own training seconds, and where it began when it went on from another run's
    checkpoints (the train stage's `origin`): those seconds were that run's."""
    seconds, origin = trained.get("train/seconds"), trained.get("origin/from")
    if not origin or origin == name:
        return seconds, None
    began = f"started from {origin} at step {trained.get('origin/step')}"
    if isinstance(seconds, int | float):
        seconds -= float(trained.get("origin/seconds") or 0.0)
    return seconds, began


def update_used(trained: dict[str, Any]) -> str | None:
    """The update path the run's train stage actually used (its `trained_on` record), with the
    batch shapes that fell back to eager; None where not recorded."""
    update = trained.get("trained_on/update")
    if not update:
        return None
    shapes = trained.get("trained_on/eager_shapes") or 0
    return f"{update} update" + (f", {shapes} shape(s) fell back to eager" if shapes else "")


def row(
    champion,
    name,
    version,
    parent,
    rec,
    bleu,
    steps,
    secs,
    ds,
    began=None,
    how=None,
    use=None,
    race=None,
):
    """A table row, WIDE's columns, "-" where unknown; `how`: the update path used; `use`: the
    other lines' champions the run used, with their versions; `race`: a student's figures."""
    cells = [
        "*" if champion else "",
        name,
        version,
        parent,
        rec,
        number(bleu),
        steps,
        duration(secs),
        "; ".join([*([began] if began else []), *(d["verdict"] for d in ds)]),
        "; ".join([*([how] if how else []), *(d["trained"] for d in ds if d.get("trained"))]),
        use,
        race,
    ]
    return ["-" if c is None else str(c) for c in cells]


def failed_runs(project: Path) -> list[list[str]]:
    """A row per flow run of this project that ended Failed or Crashed (flows/failed.py)."""
    return [
        row(False, name, None, None, None, None, None, None, [{"verdict": verdict}])
        for name, verdict in failed.runs(project)
    ]


def table(found: list[list[str]], wide: bool = False, width: int = WIDTH) -> str:
    """Aligned columns: text to the left, numbers to the right; the narrow table's last column
    cut to fit `width`."""
    columns = WIDE if wide else NARROW
    pick_ = [WIDE.index(c) for c in columns]
    lines = [list(columns), *([r[i] for i in pick_] for r in found)]
    size = [max(len(r[i]) for r in lines) for i in range(len(columns))]
    out = []
    for r in lines:
        line = "  ".join(
            c.rjust(w) if columns[i] in NUMERIC else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, size))
        ).rstrip()
        out.append(line if wide or len(line) <= width else line[: width - 3] + "...")
    return "\n".join(out)


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
        "--wide",
        action="store_true",
        help="every column, uncut: the recipe, the parent, how a retrain trained (continued, or "
        "why it fell back to scratch), the other lines' champions it used (with versions)",
    )
    parser.add_argument("--line", help="one line's runs (default: every line's, grouped)")
    args = parser.parse_args(argv)
    try:
        names = line_names(args.project)
        if args.line is not None:
            registry.artifact(args.project, args.line)  # an unknown line: an error naming it
    except (lines.LineError, registry.RegistryError) as e:
        sys.exit(f"error: {e}")
    if args.line is None and len(names) == 1:
        show(rows(args.project), args.wide)
    else:
        for name in [args.line] if args.line else names:
            show_line(args.project, name, args.wide)
        if args.line is None:
            print("\nruns of no line (gate one with `python -m flows.promote EXP --line NAME`):")
            show(unassigned(args.project), args.wide)
    saved = {e["commit"] for e in experiments(args.project)}
    tags = [
        d
        for n in ([args.line] if args.line else names)
        for d in registry.decision_tags(args.project, n)
    ]
    if any(d["commit"] not in saved for d in tags):
        print(f"(rows without steps: decisions from git tags; their experiments' details: {FETCH})")


def show(found: list[list[str]], wide: bool) -> None:
    if not found:
        print("no experiments, decisions or failed runs yet (refs/exps and decision tags empty)")
        return
    print(table(found, wide))


def show_line(project: Path, name: str, wide: bool) -> None:
    """Line `name`'s heading (its champion) and its table."""
    commit = registry.champion_commit(project, name)
    version = registry.version_of(project, commit, name) if commit else None
    print(f"\nline {name}: champion {f'{name}@{version}' if version else 'none yet'}")
    show(rows(project, name, failed=False), wide)


if __name__ == "__main__":
    main()
