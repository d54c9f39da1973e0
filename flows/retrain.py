"""@flow retrain: a fixed recipe (preset + overrides) retrained when something it depends on
changed since the champion; the candidate goes through the promotion gate (flows/promote.py).

"Changed" is any of: the training data (DVC's hash of the refreshed download stage's output),
the code (DVC's hashes of the stages' commands and code deps; `dvc status` in the workspace),
the recipe (the resolved params.yaml, `retrain` section aside). Nothing changed: nothing is
trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from flows import lineage, registry
from flows.dag import read_dag
from flows.pipeline import prepare, run_experiment, run_stages, start_attempt
from flows.promote import decide, report
from flows.shell import logger, workspace_lock

IDENTITY = ("data_hash", "code_hash", "params_sha256")  # what a champion was made from


def identity(ws: Path, commit: str) -> dict[str, Any]:
    """The IDENTITY values of the workspace as it is now (data refreshed, recipe applied)."""
    snap, dag = lineage.Snapshot(ws), read_dag(ws)
    return {
        "data_hash": lineage.outs_hash(
            lineage.locked_outs(snap.text("dvc.lock")), dag, lineage.DOWNLOAD
        ),
        "code_hash": lineage.code_now(ws),  # DVC's view: `dvc status` of the stages' code
        "params_sha256": lineage.params_hash(snap.text("params.yaml")),
    }


@flow(name="retrain", log_prints=True)
def retrain(
    preset: str | None = "demo",
    overrides: list[str] | None = None,
    rev: str = "HEAD",
    project: str = ".",
    refresh_data: bool = True,
    download_retries: int = 3,
    retry_delay_s: float = 10.0,
) -> dict[str, Any]:
    """Retrain the recipe when its data, code or params changed since the champion; promote the
    candidate only if it passes the gate. Returns the decision and why."""
    from flows.settings import RetrainConfig
    from transformer.settings import load

    root = Path(project).resolve()
    overrides = list(overrides or [])
    with workspace_lock(root):
        start_attempt()
        ws, commit = prepare(root, rev, preset, overrides)
        dag = read_dag(ws)
        force = (lineage.DOWNLOAD,) if refresh_data else ()  # fetch the source again
        run_stages(
            ws, {lineage.DOWNLOAD: dag[lineage.DOWNLOAD]}, download_retries, retry_delay_s, force
        )
        now, champion = identity(ws, commit), registry.champion(root)
        changed = [k for k in IDENTITY if not champion or champion.get(k) != now[k]]
        out: dict[str, Any] = {
            "retrained": bool(changed),
            "promoted": False,
            "champion_before": champion,
            "candidate": None,
            "version": None,
        }
        if not changed:
            out["reason"] = (
                f"data, code and recipe unchanged since the champion "
                f"({champion.get('version')}); nothing retrained"
            )
        else:
            logger().info("changed since the champion: %s", ", ".join(changed))
            candidate = run_experiment(
                ws, commit, preset, overrides, download_retries, retry_delay_s
            )
            margin = load(RetrainConfig, "retrain", ws / "params.yaml").margin
            out.update(
                decide(
                    root,
                    candidate["experiment_commit"],
                    margin,
                    f"retrain flow run {flow_run.get_id()}",
                )
            )
            out["stages"] = candidate["stages"]
            out["reason"] = f"{', '.join(changed)} changed; {out['reason']}"
    logger().info("retrain: %s", out["reason"])
    create_markdown_artifact(report(out, "Retrain"), key="retrain-decision")
    return out
