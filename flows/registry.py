"""The model registry: git tags in GTO's format on experiment commits, data on the DVC remote.

dvc.yaml's `artifacts:` names the artifact (the packaged model: weights, tokenizer, scores,
params). A promotion registers the experiment's commit as a new version (`NAME@vX.Y.Z`) and
assigns it the production stage (`NAME#prod#N`), then pushes the artifact to the default DVC
remote, so that in any clone

    dvc artifacts get . NAME --stage prod

fetches the champion and `git tag` lists the promotion history. The champion's record is read
back from its commit (params, dvc.lock, metrics), never from a file someone must commit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from flows.dag import read_dag
from flows.lineage import Snapshot, lineage
from flows.shell import logger

STAGE = "prod"


class RegistryError(RuntimeError):
    pass


def artifact(project: Path) -> tuple[str, str]:
    """(name, path) of the one artifact dvc.yaml declares."""
    arts = (yaml.safe_load((Path(project) / "dvc.yaml").read_text()) or {}).get("artifacts") or {}
    if len(arts) != 1:
        raise RegistryError(
            f"{project}/dvc.yaml: expected one entry under artifacts:, "
            f"found {len(arts)} ({', '.join(arts) or 'none'})"
        )
    ((name, spec),) = arts.items()
    return name, spec["path"]


def champion_commit(project: Path) -> str | None:
    """The commit the newest `NAME#prod#N` tag points at (as `dvc artifacts get --stage prod`
    resolves it), or None before the first promotion."""
    from dvc.exceptions import ArtifactNotFoundError
    from dvc.repo import Repo

    name, _ = artifact(project)
    with Repo(str(project)) as repo:
        try:
            return repo.artifacts.get_rev(name, stage=STAGE)
        except ArtifactNotFoundError:
            return None


def record_at(project: Path, commit: str) -> dict[str, Any]:
    """The lineage record of the run saved in `commit` (an experiment), its recipe included
    when the commit message carries one (flow runs write it there)."""
    snap = Snapshot(project, commit)
    message = snap.git("log", "-1", "--format=%B", commit)
    recipe = {}
    for line in message.splitlines():
        if line.startswith("recipe: "):
            recipe = json.loads(line.removeprefix("recipe: "))
    baseline = snap.git("rev-parse", f"{commit}^") or commit
    return lineage(
        snap, read_dag(project, rev=commit), baseline, experiment_commit=commit, **recipe
    )


def champion(project: Path) -> dict[str, Any] | None:
    commit = champion_commit(project)
    if commit is None:
        return None
    return {**record_at(project, commit), "version": version_of(project, commit)}


def versions(project: Path) -> dict[str, str]:
    """{commit: version} of every registered version of the artifact."""
    from gto.api import show
    from gto.exceptions import ArtifactNotFound

    name, _ = artifact(project)
    try:
        found = show(str(project), name, table=False)
    except ArtifactNotFound:  # nothing registered yet
        return {}
    return {v["commit_hexsha"]: v["version"] for v in found if v.get("registrations")}


def version_of(project: Path, commit: str) -> str | None:
    return versions(project).get(commit)


def promote(project: Path, commit: str, summary: dict[str, Any], reason: str) -> str:
    """Register `commit` as the artifact's next version, assign it the production stage and push
    its data to the default DVC remote (if one is configured); the new version."""
    from gto.api import assign, register

    name, path = artifact(project)
    message = json.dumps({"reason": reason, **summary}, default=str, sort_keys=True)
    known = versions(project)
    major = max((int(v.lstrip("v").split(".")[0]) for v in known.values()), default=0)
    version = (
        known.get(commit)
        or register(
            str(project),
            name,
            commit,
            version=f"v{major + 1}.0.0",
            message=f"Registering {name}: {message}",
        ).version
    )
    assign(str(project), name, STAGE, version=version, message=f"Promoting {name}: {message}")
    push(project, path, commit)
    return version


def push(project: Path, path: str, commit: str) -> bool:
    """The artifact's data at `commit` to the project's default DVC remote as configured now
    (an older commit may predate it); False, with a warning, where none is configured."""
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        name = repo.config["core"].get("remote")
        conf = dict(repo.config["remote"].get(name) or {}) if name else {}
    if not conf:
        logger().warning(
            "no default DVC remote: the champion is in this machine's DVC cache "
            "only (`dvc remote add -d NAME URL`, committed, shares it)"
        )
        return False
    with Repo(str(project), remote=name, remote_config=conf) as repo:
        n = repo.push(targets=[path], revs=[commit], workspace=False, remote=name)
    logger().info("pushed %s of %s to the DVC remote %r (%d new files)", path, commit[:9], name, n)
    return True
