"""The pipeline DAG as DVC reads it from dvc.yaml: stages, their upstream stages, their outputs.

There is no copy of the DAG in Python: everything here asks DVC's own index, so a stage added
to dvc.yaml is scheduled by the flows without a code change. `python -m flows.dag` prints it.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from transformer.core.settings import parse_yaml


@dataclass(frozen=True)
class Stage:
    name: str
    upstream: tuple[str, ...]  # stages whose outputs this one depends on
    outs: tuple[str, ...]  # every output path, as dvc.yaml names it
    metrics: tuple[str, ...]  # metrics files among the outputs
    plots: tuple[str, ...]  # plots files or directories among the outputs
    uncached: tuple[str, ...]  # outputs with `cache: false` (meant to be tracked by git)


def read_dag(project: Path, rev: str | None = None) -> dict[str, Stage]:
    """The stages of dvc.yaml (in the folder, or at commit `rev`) in topological order (upstream
    first), as DVC's index sees them."""
    from dvc.repo import Repo

    sha = commit_sha(project, rev) if rev is not None else None
    if sha:  # a commit's DAG never changes: read once, from the commit's file system
        return dict(_dag_at(str(Path(project).resolve()), sha))
    with Repo(str(project), rev=rev) as repo:
        return _stages(repo)


def commit_sha(project: Path, rev: str) -> str | None:
    """The full sha of the commit `rev` names in the project's git repository, if it names one."""
    r = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )
    return r.stdout.strip() or None


@functools.lru_cache(maxsize=16)
def files_at(project: str, sha: str):
    """DVC's file system of the project at commit `sha` (git- and DVC-tracked files), one per
    commit and process: DVC parses dvc.yaml and dvc.lock (pure Python, ~0.3 s) when its index is
    first needed, and a commit's never changes."""
    from dvc.api import DVCFileSystem

    return DVCFileSystem(project, rev=sha, subrepos=True)


@functools.lru_cache(maxsize=16)
def _dag_at(project: str, sha: str) -> dict[str, Stage]:
    return _stages(files_at(project, sha).repo)


def _stages(repo) -> dict[str, Stage]:
    import networkx as nx

    graph = repo.index.graph  # edge: stage -> a stage it depends on
    stages = {}
    for node in reversed(list(nx.topological_sort(graph))):
        if not _is_cmd(node):
            continue
        outs = node.outs
        name = _address(node, repo.root_dir)
        stages[name] = Stage(
            name=name,
            upstream=tuple(
                sorted(_address(u, repo.root_dir) for u in graph.successors(node) if _is_cmd(u))
            ),
            outs=tuple(str(o.def_path) for o in outs),
            metrics=tuple(str(o.def_path) for o in outs if o.metric),
            plots=tuple(str(o.def_path) for o in outs if o.plot),
            uncached=tuple(str(o.def_path) for o in outs if not o.use_cache),
        )
    return stages


def _is_cmd(stage) -> bool:
    return bool(getattr(stage, "cmd", None))  # False for `dvc add`-ed data


def _address(stage, root: str) -> str:
    """The stage's name as `dvc repro` takes it when run from the project root."""
    dvcfile = os.path.relpath(stage.path, root)
    return stage.name if dvcfile == "dvc.yaml" else f"{dvcfile}:{stage.name}"


def generations(dag: dict[str, Stage]) -> list[list[str]]:
    """Stages grouped into waves: every stage of a wave only needs stages of earlier waves."""
    level: dict[str, int] = {}
    for name, stage in dag.items():  # dag is topologically ordered
        level[name] = 1 + max((level[u] for u in stage.upstream), default=-1)
    waves: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for name, n in level.items():
        waves[n].append(name)
    return waves


def locked_outs(lock_text: str | None) -> dict[str, dict[str, str]]:
    """{stage: {out path: content hash}} from dvc.lock's text (empty if the pipeline never ran)."""
    lock = parse_yaml(lock_text) if lock_text else None
    return {
        name: {o["path"]: o.get("md5") or o.get("hash", "") for o in entry.get("outs", [])}
        for name, entry in ((lock or {}).get("stages") or {}).items()
    }


def main(argv: list[str] | None = None) -> None:
    project = Path((argv if argv is not None else sys.argv[1:] or ["."])[0])
    dag = read_dag(project)
    for i, wave in enumerate(generations(dag)):
        print(f"{i}: " + ", ".join(f"{s} <- {', '.join(dag[s].upstream) or '-'}" for s in wave))


if __name__ == "__main__":
    main()
