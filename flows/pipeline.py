"""@flow pipeline: one Prefect task per DVC stage, in the DAG order DVC reads from dvc.yaml.

A run never touches the user's checkout: it works in the project's run workspace
(flows/workspace.py) at a committed revision, with the run's preset and overrides written into
the workspace's params.yaml. Each task is `dvc repro --single-item STAGE` there, so DVC decides
what is stale, skips what is not, fills the shared cache and writes dvc.lock; a stage starts as
soon as its upstream stages are done. The run is saved with `dvc exp save` (params, dvc.lock,
metrics; the recipe in the commit message), so `dvc exp show` in the checkout lists it. The
other lines' champions params.yaml pins (`helpers`) are fetched first (flows/helpers.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.runtime import deployment, flow_run
from prefect.tasks import exponential_backoff

from flows import cores, helpers, lineage, lines, progress, recipe, workspace
from flows.artifacts import written
from flows.curves import publish_curves
from flows.dag import Stage, read_dag
from flows.locks import experiments_lock, workspace_lock
from flows.shell import (
    TRANSIENT,
    CommandError,
    apply_params,
    dvc,
    logger,
    stop_all,
    watch_parent,
)
from transformer.core.metrics import RUN_ENV

MAX_ATTEMPTS = 3  # runs of one flow run: the first, and the retries after crashes
PREEMPTED_RESUMES = 3  # a stage preempted (exit 75) is resumed this many times in its task run
RETRY_DELAYS_S = (2, 10, 30)  # before each retry of a failure that may pass


def _retriable(task, task_run, state) -> bool:
    """Retry a stage when the cause may pass: another dvc process held the lock it needed, the
    stage was killed by a signal, the disk was full, the network failed."""
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, CommandError) and (exc.lock_busy or exc.transient)


@task(
    cache_policy=NO_CACHE,
    retries=len(RETRY_DELAYS_S),
    retry_delay_seconds=list(RETRY_DELAYS_S),
    retry_condition_fn=_retriable,
)
def repro(ws: Path, stage: str, force: bool = False) -> str:
    """`dvc repro --single-item STAGE`: "ran", "skipped" (unchanged) or "restored" (run-cache)."""
    t0 = time.monotonic()
    logger().info("stage %s: started", stage)
    # the train stage: its turn on the machine's cores first (other lines wait), then its bar
    with cores.slot(ws, stage), progress.shown(ws, stage):
        for resumes in range(PREEMPTED_RESUMES + 1):
            try:
                out = dvc(
                    "repro",
                    "--single-item",
                    *(["--force"] if force else []),
                    stage,
                    cwd=ws,
                    what=f"stage {stage}",
                )
                break
            except CommandError as e:
                if not e.preempted or resumes == PREEMPTED_RESUMES:
                    raise
                resuming(
                    f"stage {stage} preempted ({e.cause}); resuming ({resumes + 1} of "
                    f"{PREEMPTED_RESUMES})"
                )
    text = "\n".join(out)
    done = "skipped" if "didn't change" in text else "restored" if "is cached" in text else "ran"
    logger().info("stage %s: %s (%.0f s)", stage, done, time.monotonic() - t0)
    return done


def resuming(message: str) -> None:
    """A preempted stage's retry, in the task run's state (Retrying, its message saying why) and
    log: no failure, and it does not count against the retries of failures."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import task_run
    from prefect.states import Retrying

    logger().warning("%s", message)
    with get_client(sync_client=True) as client:
        client.set_task_run_state(task_run.get_id(), Retrying(message=message), force=True)


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
    ws: Path,
    dag: dict[str, Stage],
    download_retries: int = 3,
    retry_delay_s: float = 10.0,
    force: tuple[str, ...] = (),
    done: dict[str, str] | None = None,
) -> dict[str, str]:
    """Submit every stage once its upstream stages are done, but those `done` already in this
    flow run (with their outcome); {stage: "ran" | "skipped" | ...}."""
    done, futures = dict(done or {}), {}
    for name, stage in dag.items():  # topological order: upstream futures exist already
        if name in done:
            continue
        futures[name] = stage_task(name, download_retries, retry_delay_s).submit(
            ws, name, name in force, wait_for=[futures[u] for u in stage.upstream if u in futures]
        )
    try:
        wait(list(futures.values()))
    except BaseException:  # cancelled (Prefect's TerminationSignal), Ctrl-C: the stages stop as
        stop_all()  # preempted ones do (the train stage saves its update in progress), in time
        raise
    return {name: done.get(name) or futures[name].result() for name in dag}


def start_attempt() -> None:
    """Bound the attempts of this flow run (serve.py's automation reschedules a crashed run),
    say why the last one ended, and make this one crash, saying so, if the process that
    serves it dies (its stages are stopped: the retry resumes them)."""
    from prefect.client.orchestration import get_client

    n, run_id = flow_run.get_run_count(), flow_run.get_id()
    if flow_run.get_parent_flow_run_id():
        return  # a subflow: its parent flow run does this
    if n > 1:
        with get_client(sync_client=True) as client:
            crashed = [s for s in client.read_flow_run_states(run_id) if s.is_crashed()]
        why = crashed[-1].message if crashed else "unknown"
        if n > MAX_ATTEMPTS:
            raise RuntimeError(f"giving up after {MAX_ATTEMPTS} attempts; the last crashed: {why}")
        logger().warning(
            "attempt %d of %d; the last one crashed: %s. Resuming in the run workspace",
            n,
            MAX_ATTEMPTS,
            why,
        )
    if deployment.get_id():  # started by a serve process or a worker, not called in-process
        watch_parent(lambda parent: _orphaned(run_id, parent))


def _orphaned(run_id: str, parent: int) -> None:
    """The serving process died: stop the stages, mark the run Crashed naming why, exit."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    message = (
        f"the process serving this flow run (pid {parent}: `python -m flows.serve` or a "
        "worker) died; its stages were stopped, and a retry resumes them"
    )
    # the server may be unreachable too: then the missing heartbeats tell
    with contextlib.suppress(Exception), get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Crashed(message=message), force=True)
    stop_all()
    os._exit(70)


def prepare(
    root: Path, rev: str, preset: str | None, overrides: list[str], line: str | None = None
) -> tuple[Path, str]:
    """The run workspace (line `line`'s) at `rev` with the recipe applied; (its path, the
    commit)."""
    for delay_s in (*RETRY_DELAYS_S, None):  # a full disk may pass, as for the stages
        try:
            ws, commit = workspace.prepare(root, rev, line)
            apply_params(ws, preset, overrides)
            break
        except (CommandError, OSError, workspace.WorkspaceError) as e:
            full = isinstance(e, OSError) and e.errno == errno.ENOSPC
            if delay_s is None or not (full or TRANSIENT.search(str(e))):
                raise
            logger().warning("%s; trying again in %d s", str(e).splitlines()[0], delay_s)
            time.sleep(delay_s)
    logger().info(
        "run workspace %s at %s; preset %s, overrides %s", ws, commit[:9], preset, overrides
    )
    return ws, commit


def save_experiment(ws: Path, dag: dict[str, Stage], name: str, recipe: dict[str, Any]) -> str:
    """`dvc exp save` the workspace, with the git-ignored uncached metrics and plots (not other
    uncached outputs, such as the checkpoints: the workspace keeps those, not git); the exp
    commit. The recipe goes into the commit message, where registry.record_at reads it back."""
    import json

    uncached = [
        p
        for s in dag.values()
        for p in s.uncached
        if p in s.metrics + s.plots and (ws / p).exists()
    ]
    include = [a for p in uncached for a in ("--include-untracked", p)]
    msg = (
        f"Prefect flow run {flow_run.get_id()} ({flow_run.get_name()})\n\n"
        f"recipe: {json.dumps(recipe)}"
    )
    # the project whose worktree `ws` is: its repository's refs are every line's
    common = workspace.git("rev-parse", "--path-format=absolute", "--git-common-dir", cwd=ws)
    with experiments_lock(Path(common).parent):
        dvc("exp", "save", "--force", "-n", name, "-m", msg, *include, cwd=ws)
        return workspace.git("rev-parse", f"refs/exps/{experiment_ref(ws, name)}", cwd=ws)


def experiment_ref(ws: Path, name: str) -> str:
    """The ref of experiment `name` under refs/exps (DVC nests it by its baseline commit)."""
    refs = workspace.git("for-each-ref", "refs/exps", "--format=%(refname)", cwd=ws).split()
    (ref,) = [r for r in refs if r.rsplit("/", 1)[1] == name]
    return ref.removeprefix("refs/exps/")


def publish(
    ws: Path, dag: dict[str, Stage], record: dict[str, Any], champion: dict[str, Any] | None = None
) -> None:
    """The lineage table artifact and the training curves' (with `champion`'s beside)."""
    rows = [{"field": k, "value": str(v)} for k, v in record.items()]
    bleu = record.get("bleu")
    written(  # its description is what `python -m flows.run --wait` prints
        create_table_artifact,
        rows,
        key="lineage",
        description=(
            f"experiment {record['experiment']}: BLEU "
            + ("-" if bleu is None else f"{float(bleu):.2f}")
            + f" (through the gate: python -m flows.promote {record['experiment']})"
        ),
    )
    publish_curves(ws, dag, record["experiment"], champion)


@flow(name="pipeline", log_prints=True)
def pipeline(
    preset: str | None = None,
    overrides: list[str] | None = None,
    rev: str = "HEAD",
    project: str = ".",
    download_retries: int = 3,
    retry_delay_s: float = 10.0,
) -> dict[str, Any]:
    """Run dvc.yaml's stages on commit `rev` of the project with the preset and the
    `dvc exp run -S` overrides, in the run workspace; save the experiment, with the line whose
    recipe it ran (flows/recipe.py: what `python -m flows.promote` gates it in); its record."""
    root = Path(project).resolve()
    overrides = list(overrides or [])
    with workspace_lock(root):
        start_attempt()
        ws, commit = prepare(root, rev, preset, overrides)
        line = line_of_recipe(root, commit, preset, overrides)
        return run_experiment(
            ws, commit, preset, overrides, download_retries, retry_delay_s, line=line
        )


def line_of_recipe(root: Path, commit: str, preset: str | None, overrides: list[str]) -> str | None:
    """The line whose recipe the run is, as `commit` declares the lines; None where none fits,
    several fit alike, or the commit declares none readable (said in the log)."""
    try:
        fits = recipe.belongs(root, commit, preset, overrides)
    except lines.LineError as e:
        fits, why = [], str(e)
    else:
        why = f"it is each of {', '.join(x.name for x in fits)}'s alike" if fits else "no line's"
    if len(fits) == 1:
        logger().info("the recipe of line %s", fits[0].name)
        return fits[0].name
    logger().info("the recipe of no line: %s", why)
    return None


def run_experiment(
    ws: Path,
    commit: str,
    preset: str | None,
    overrides: list[str],
    download_retries: int = 3,
    retry_delay_s: float = 10.0,
    done: dict[str, str] | None = None,
    dag: dict[str, Stage] | None = None,
    line: str | None = None,
    champion: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The stages in the prepared workspace `ws` (at `commit`, the recipe applied) but those
    `done` already, the experiment saved and published; its record. pipeline() and retrain()
    share it after their preamble; `dag`: the workspace's, if the caller has read it (DVC parses
    dvc.yaml for each read, ~0.5 s); `champion`: the record whose curves the run's are drawn
    beside."""
    dag = dag or read_dag(ws)
    name = f"{flow_run.get_flow_name()}-{flow_run.get_name()}-{flow_run.get_id()[:8]}"
    # the train stage records it in its checkpoints: a later run that goes on from them (the
    # workspace keeps one set) says from which experiment, at which step
    os.environ[RUN_ENV] = name
    helpers.fetch(ws, dag)  # the other lines' champions params.yaml pins, for the helpers stage
    stages = run_stages(ws, dag, download_retries, retry_delay_s, done=done)
    recipe = {"preset": preset, "overrides": overrides, **({"line": line} if line else {})}
    exp_commit = save_experiment(ws, dag, name, recipe)
    record = lineage.lineage(
        lineage.Snapshot(ws), dag, commit, experiment=name, experiment_commit=exp_commit, **recipe
    )
    publish(ws, dag, record, champion)
    return {"stages": stages, **record}
