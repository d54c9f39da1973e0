"""The flow runs of a project that failed before they saved an experiment, from the Prefect
server: the last rows of `make results` (flows/results.py)."""

from __future__ import annotations

import os
from pathlib import Path

from flows.lineage import Snapshot


def project_tags(project: Path) -> list[str]:
    """The Prefect tags of this project's flow runs (serve.py tags its deployments with the
    checkout's path): this checkout's, and its origin's where that is a local path (a clone)."""
    from flows.serve import project_tag

    paths = [Path(project).resolve()]
    origin = Snapshot(project).git("config", "--get", "remote.origin.url").strip()
    if origin and Path(origin).is_dir():
        paths.append(Path(origin).resolve())
    return [project_tag(p) for p in paths]


def runs(project: Path) -> list[tuple[str, str]]:
    """(name, why) of each flow run of this project that ended Failed or Crashed (it saved no
    experiment), from the Prefect server when one is configured; none without."""
    if not os.environ.get("PREFECT_API_URL"):
        return []
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    out = []
    try:
        with get_client(sync_client=True) as client:
            for tag in project_tags(project):
                runs = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(
                        tags=FlowRunFilterTags(all_=[tag]),
                        state=FlowRunFilterState(
                            type=FlowRunFilterStateType(any_=[StateType.FAILED, StateType.CRASHED])
                        ),
                    ),
                    sort=FlowRunSort.START_TIME_ASC,
                )
                for r in runs:
                    why = (r.state.message or "no message").splitlines()[0]
                    out.append((f"(run {r.name})", f"{r.state.name.lower()}: {why}"))
    except (httpx.HTTPError, OSError) as e:
        print(f"warning: the Prefect server did not answer ({e}): no failed runs listed")
    return out
