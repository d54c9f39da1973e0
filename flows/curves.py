"""The "Training curves" artifact: dvc.yaml's `plots` drawn as pictures in the Prefect UI.

DVC's API reads the plots as `dvc plots show` does (this run's files, and for a retrain the
champion's experiment commit, drawn in its own colour: `dvc plots diff`); transformer/core/curves.py
fills DVC's Vega-Lite templates and renders them offline. Prefect's markdown artifacts show images
given as data URIs (inline <svg> is stripped), so the pictures travel in the artifact itself: no
server, no network, no file the browser cannot open. The table of numbers stays under them,
less the curves that never changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact

from flows.artifacts import written
from flows.dag import Stage
from flows.shell import logger
from transformer.core import curves

THIS_RUN = "this run"  # the workspace's curves, as the legend names them
# the artifact's budget: each picture is bounded (curves.MAX_SVG_BYTES, then PNG), this bounds
# the whole (base64 grows it by a third); Prefect's server stores the markdown as one field
MAX_ARTIFACT_BYTES = 1_000_000


def plot_ids(ws: Path) -> list[str]:
    """The top-level plots dvc.yaml defines (the pictures), in its order."""
    from transformer.core.settings import parse_yaml

    plots = (parse_yaml((Path(ws) / "dvc.yaml").read_text()) or {}).get("plots") or []
    return [k for p in plots if isinstance(p, dict) for k in p]


def figures(ws: Path, champion: dict[str, Any] | None = None) -> dict[str, tuple[str, bytes]]:
    """{plot id: (MIME type, picture)} of dvc.yaml's top-level plots in the workspace `ws`, with
    `champion`'s curves (its experiment commit's files, from git or the DVC cache) beside."""
    from dvc.repo import Repo

    ids = plot_ids(ws)
    if not ids:
        return {}
    commit = (champion or {}).get("experiment_commit")
    revs = ["workspace", commit] if commit else ["workspace"]
    with Repo(str(ws)) as repo:
        data = repo.plots.show(targets=ids, revs=revs)
    label = f"champion {champion.get('version')}" if commit and champion else None
    named = {(THIS_RUN if rev == "workspace" else label): v for rev, v in data.items()}
    return {name: curves.picture(spec) for name, spec in curves.specs(named).items()}


def changing(ws: Path, dag: dict[str, Stage]) -> list[tuple[str, int, str, str]]:
    """(file, points, first, last) of each plotted .tsv whose values changed: a curve that is
    flat all along (cpu_steal 0.0 -> 0.0) says nothing a row should."""
    rows = []
    for stage in dag.values():
        for plot in stage.plots:
            base = ws / plot
            for f in sorted(base.rglob("*.tsv") if base.is_dir() else [base]):
                if not f.is_file() or not (data := curves.read_tsv(f)):
                    continue
                col = list(data[0])[-1]
                values = [r[col] for r in data]
                if len(set(values)) > 1:
                    rows.append((str(f.relative_to(ws)), len(values), values[0], values[-1]))
    return rows


def markdown(
    experiment: str,
    pictures: dict[str, tuple[str, bytes]],
    rows: list[tuple[str, int, str, str]],
    champion: dict[str, Any] | None = None,
) -> str:
    """The artifact's text: the pictures as data URIs, how to draw them again, the table."""
    lines = [f"# Training curves: {experiment}", ""]
    images = [f"![{name}]({curves.data_uri(*pic)})" for name, pic in pictures.items()]
    if champion and champion.get("experiment_commit"):
        lines += [
            (
                f"Beside the champion {champion.get('version')} ({champion.get('experiment')}), "
                "where it has the same curves."
            ),
            "",
        ]
    budget = MAX_ARTIFACT_BYTES - 20_000  # the text and the table
    for img in images:
        if (budget := budget - len(img)) < 0:
            logger().warning("training curves: %s left out, past the artifact's size", img[:40])
            continue
        lines += [img, ""]
    if not images:
        lines += ["No curves to draw: dvc.yaml's top-level `plots` found no points.", ""]
    cmd = f"`dvc exp apply {experiment}` then `dvc plots show`"
    if champion and champion.get("experiment_commit"):
        cmd += f" (beside the champion: `dvc plots diff {champion['experiment_commit'][:9]}`)"
    lines += [
        f"Again from git + DVC alone: {cmd}.",
        "",
        "| curve | points | first | last |",
        "|---|---|---|---|",
        *(f"| {f} | {n} | {a} | {b} |" for f, n, a, b in rows),
    ]
    return "\n".join(lines)


def publish_curves(
    ws: Path, dag: dict[str, Stage], experiment: str, champion: dict[str, Any] | None = None
) -> str:
    """The "training-curves" markdown artifact of the run in `ws`; its text."""
    try:
        pictures = figures(ws, champion)
    except Exception as e:  # noqa: BLE001 (a picture is not worth failing a trained run)
        logger().warning("training curves: not drawn (%s: %s)", type(e).__name__, e)
        pictures = {}
    text = markdown(experiment, pictures, changing(ws, dag), champion)
    written(create_markdown_artifact, text, key="training-curves")
    return text
