"""@flow pipeline: one Prefect task per DVC stage, in the DAG order DVC reads from dvc.yaml.

Each task is `dvc repro --single-item STAGE`, so DVC decides what is stale, skips what is not,
fills its cache and writes dvc.lock; a stage starts as soon as its upstream stages are done.
The run is saved with `dvc exp save` (params, dvc.lock, metrics), so `dvc exp show` lists it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.runtime import flow_run
from prefect.tasks import exponential_backoff

from flows import lineage
from flows.dag import Stage, read_dag
from flows.shell import CommandError, apply_params, dvc, workspace_lock


def _lock_busy(task, task_run, state) -> bool:
    """Retry a stage only when another dvc process held the lock it needed."""
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, CommandError) and exc.lock_busy


@task(cache_policy=NO_CACHE, retries=3, retry_delay_seconds=2, retry_condition_fn=_lock_busy)
def repro(project: Path, stage: str, force: bool = False) -> str:
    """`dvc repro --single-item STAGE`: "ran", "skipped" (unchanged) or "restored" (run-cache)."""
    out = dvc("repro", "--single-item", *(["--force"] if force else []), stage, cwd=project)
    text = "\n".join(out)
    return "skipped" if "didn't change" in text else "restored" if "is cached" in text else "ran"


def stage_task(stage: str, download_retries: int, retry_delay_s: float):
    """The task for `stage`: download retries any failure with exponential backoff."""
    if stage != lineage.DOWNLOAD:
        return repro.with_options(name=stage)
    delays = exponential_backoff(backoff_factor=retry_delay_s)(download_retries)
    return repro.with_options(
        name=stage,
        retries=download_retries,
        retry_delay_seconds=delays,
        retry_condition_fn=lambda task, task_run, state: True,
        retry_jitter_factor=0.2,
    )


def run_stages(
    project: Path,
    dag: dict[str, Stage],
    download_retries: int = 3,
    retry_delay_s: float = 10.0,
    force: tuple[str, ...] = (),
) -> dict[str, str]:
    """Submit every stage once its upstream stages are done; {stage: "ran" | "skipped" | ...}."""
    futures = {}
    for name, stage in dag.items():  # topological order: upstream futures exist already
        futures[name] = stage_task(name, download_retries, retry_delay_s).submit(
            project, name, name in force, wait_for=[futures[u] for u in stage.upstream]
        )
    wait(list(futures.values()))
    return {name: f.result() for name, f in futures.items()}


def save_experiment(project: Path, dag: dict[str, Stage], name: str) -> str:
    """`dvc exp save` the workspace, with the git-ignored uncached metrics; the exp commit.
    (Not other uncached outputs, such as the checkpoints: the workspace keeps those, not git.)"""
    uncached = [p for s in dag.values() for p in s.uncached
                if p in s.metrics + s.plots and (project / p).exists()]
    include = [a for p in uncached for a in ("--include-untracked", p)]
    msg = f"Prefect flow run {flow_run.get_id()} ({flow_run.get_name()})"
    dvc("exp", "save", "--force", "-n", name, "-m", msg, *include, cwd=project)
    refs = dvc_refs(project)
    return refs.get(name, "")


def dvc_refs(project: Path) -> dict[str, str]:
    """{experiment name: commit} for the experiments saved in the project's git repo."""
    import subprocess

    out = subprocess.run(
        ["git", "for-each-ref", "refs/exps", "--format=%(objectname) %(refname)"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {r.rsplit("/", 1)[1]: sha for sha, r in (line.split() for line in out.splitlines())}


def publish(project: Path, dag: dict[str, Stage], record: dict[str, Any]) -> None:
    """The lineage table artifact and the markdown artifact linking the training curves."""
    gaps = lineage.missing(record, dag)
    rows = [{"field": k, "value": str(v)} for k, v in record.items()]
    rows += [{"field": "missing", "value": g} for g in gaps]
    create_table_artifact(
        rows, key="lineage", description="Score -> inputs: " + record["experiment"]
    )
    html = project / "dvc_plots" / record["experiment"]
    html.mkdir(parents=True, exist_ok=True)
    dvc("plots", "show", "--out", str(html), cwd=project)
    lines = [
        f"# Training curves: {record['experiment']}",
        "",
        f"Rendered by DVC: [index.html]({(html / 'index.html').as_uri()})",
        "",
        "Again from git + DVC alone: `dvc exp apply "
        + record["experiment"]
        + "` then `dvc plots show`; compare runs with `dvc plots diff`.",
        "",
        "| curve | points | first | last |",
        "|---|---|---|---|",
    ]
    lines += [f"| {f} | {n} | {a} | {b} |" for f, n, a, b in lineage.curves(project, dag)]
    create_markdown_artifact("\n".join(lines), key="training-curves")


@flow(name="pipeline", log_prints=True)
def pipeline(
    preset: str | None = None,
    overrides: list[str] | None = None,
    project: str = ".",
    download_retries: int = 3,
    retry_delay_s: float = 10.0,
) -> dict[str, Any]:
    """Run dvc.yaml's stages (preset and `dvc exp run -S` overrides first); save the experiment."""
    root = Path(project).resolve()
    with workspace_lock(root):
        apply_params(root, preset, list(overrides or []))
        dag = read_dag(root)
        stages = run_stages(root, dag, download_retries, retry_delay_s)
        name = f"{flow_run.get_flow_name()}-{flow_run.get_name()}"
        commit = save_experiment(root, dag, name)
        record = lineage.lineage(
            root,
            dag,
            experiment=name,
            experiment_commit=commit,
            preset=preset,
            overrides=list(overrides or []),
        )
        publish(root, dag, record)
    return {"stages": stages, **record}
