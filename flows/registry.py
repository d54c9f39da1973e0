"""The model registry: git tags in GTO's format on experiment commits, data on the DVC remote.

Each entry of dvc.yaml's `artifacts:` is a line (flows/lines.py), its own artifact: the packaged
model of one recipe. A promotion registers the experiment's commit as the line's next version
(`NAME@vX.Y.Z`) and assigns it the production stage (`NAME#prod#N`), pushes the artifact to the
default DVC remote and the tags to the git remote `origin` (flows/tags.py), so that in any clone

    dvc artifacts get . NAME --stage prod

fetches the champion and `git tag` lists the promotion history. The champion's record is read
back from its commit (params, dvc.lock, metrics), never from a file someone must commit.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

# gto at import time, not in a flow run: importing it runs logging.config.dictConfig, which
# flushes every handler, and Prefect's API log handler then waits for its queue (~2.5 s)
import gto.api
from gto.exceptions import ArtifactNotFound

from flows import lines, tags
from flows.dag import read_dag
from flows.lineage import Snapshot, lineage
from flows.shell import logger
from flows.workspace import git

STAGE = "prod"


class RegistryError(RuntimeError):
    pass


def artifact(project: Path, name: str | None = None) -> tuple[str, str]:
    """(name, path) of line `name`, or of the project's only line when None."""
    try:
        found = lines.get(Path(project), name)
    except lines.LineError as e:
        raise RegistryError(str(e)) from None
    return found.name, found.path


def first(project: Path) -> str:
    """The name of the project's first line (all share the package's path)."""
    return lines.read(Path(project))[0].name


def champion_commit(project: Path, name: str | None = None) -> str | None:
    """The commit the newest `NAME#prod#N` tag points at (as `dvc artifacts get --stage prod`
    resolves it), or None before the line's first promotion."""
    from dvc.exceptions import ArtifactNotFoundError
    from dvc.repo import Repo

    name, _ = artifact(project, name)
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
        snap,
        read_dag(project, rev=commit),
        baseline,
        experiment=experiment_name(project, commit),
        experiment_commit=commit,
        **recipe,
    )


def experiment_name(project: Path, commit: str) -> str | None:
    """The name of the experiment (a ref under refs/exps) saved at `commit`, if one is."""
    refs = (
        Snapshot(project)
        .git("for-each-ref", "refs/exps", "--points-at", commit, "--format=%(refname)")
        .split()
    )
    return refs[0].rsplit("/", 1)[1] if refs else None


def champion(project: Path, name: str | None = None) -> dict[str, Any] | None:
    """The record of line `name`'s champion (the only line's when None), its version included."""
    commit = champion_commit(project, name)
    if commit is None:
        return None
    return {**record_at(project, commit), "version": version_of(project, commit, name)}


def versions(project: Path, name: str | None = None) -> dict[str, str]:
    """{commit: version} of every registered version of line `name`."""
    name, _ = artifact(project, name)
    try:
        found = gto.api.show(str(project), name, table=False)
    except ArtifactNotFound:  # nothing registered yet
        return {}
    return {v["commit_hexsha"]: v["version"] for v in found if v.get("registrations")}


def version_of(project: Path, commit: str, name: str | None = None) -> str | None:
    return versions(project, name).get(commit)


def promote(
    project: Path, commit: str, summary: dict[str, Any], reason: str, name: str | None = None
) -> str:
    """Register `commit` as line `name`'s next version, assign it the production stage, push
    its data to the default DVC remote and its tags to `origin` (each where configured); the
    new version."""
    name, path = artifact(project, name)
    message = json.dumps({"reason": reason, **summary}, default=str, sort_keys=True)
    known = versions(project, name)
    major = max((int(v.lstrip("v").split(".")[0]) for v in known.values()), default=0)
    version = (
        known.get(commit)
        or gto.api.register(
            str(project),
            name,
            commit,
            version=f"v{major + 1}.0.0",
            message=f"Registering {name}: {message}",
        ).version
    )
    gto.api.assign(
        str(project), name, STAGE, version=version, message=f"Promoting {name}: {message}"
    )
    tags.push_line(project, name)
    try:
        push(project, path, commit)
    except RegistryError as e:  # the version stands; its data follows with the next publish
        logger().warning(
            "%s is not published yet (%s): the next promotion, or `python -m flows.registry "
            "publish`, publishes it",
            version,
            e,
        )
    return version


def default_remote(project: Path) -> tuple[str, dict[str, Any]] | None:
    """(name, config) of the project's default DVC remote as configured now, or None."""
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        name = repo.config["core"].get("remote")
        conf = dict(repo.config["remote"].get(name) or {}) if name else {}
    return (name, conf) if conf else None


NO_REMOTE = (
    "no default DVC remote: the champion is in this machine's DVC cache only. Add one "
    "(`dvc remote add -d store URL`, then commit .dvc/config), then `python -m flows.registry "
    "publish`"
)


def push(project: Path, path: str, commit: str, tries: int = 3, delay_s: float = 5.0) -> int | None:
    """The artifact's data at `commit` to the project's default DVC remote as configured now
    (an older commit may predate it), tried `tries` times (a remote may be down a while); the
    number of files uploaded (0: all there already), or None, with a warning, without a remote.
    """
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    remote = default_remote(project)
    if remote is None:
        logger().warning(NO_REMOTE)
        return None
    name, conf = remote
    for attempt in range(1, tries + 1):
        try:
            with Repo(str(project), remote=name, remote_config=conf) as repo:
                n = repo.push(targets=[path], revs=[commit], workspace=False, remote=name)
            break
        except (DvcException, OSError) as e:  # DVC's errors; the file system's (a local remote)
            if attempt == tries:
                raise RegistryError(f"pushing {path} of {commit[:9]} to {name!r}: {e}") from e
            logger().warning("pushing to %r failed (%s); trying again", name, e)
            time.sleep(delay_s * attempt)
    logger().info("pushed %s of %s to the DVC remote %r (%d new files)", path, commit[:9], name, n)
    return n


def publish(project: Path) -> dict[str, dict[str, int]]:
    """Every line's registered versions' data to the default DVC remote (what a promotion
    without a remote, or with the remote down, left behind); {line: {version: files uploaded}}.
    """
    if default_remote(project) is None:
        raise RegistryError(NO_REMOTE)
    return {
        x.name: {v: push(project, x.path, c) or 0 for c, v in versions(project, x.name).items()}
        for x in lines.read(Path(project))
    }


def publish_pending(project: Path) -> None:
    """publish(), where a remote is configured, as each promotion decision does first: a version
    whose push failed (the remote down) is published by the next decision."""
    if default_remote(project) is None:
        return
    try:
        publish(project)
    except RegistryError as e:
        logger().warning("%s; the next promotion decision tries again", e)


DECISIONS = "decision/{name}/"  # the tag prefix of every promotion decision of artifact `name`


def record_decision(
    project: Path, commit: str, verdict: str, details: dict[str, Any], name: str | None = None
) -> str:
    """An annotated tag `decision/NAME/NNNN` on the candidate's commit: the candidate and the
    verdict on its first line, `details` (JSON) below, pushed to `origin` where there is one.
    GTO's tags record promotions only; these record refusals too, so `git tag -n` tells the
    registry's whole history. The tag's name."""
    name, _ = artifact(project, name)
    prefix = DECISIONS.format(name=name)
    n = len(Snapshot(project).git("tag", "--list", prefix + "*").split()) + 1
    tag = f"{prefix}{n:04d}"
    who = (details.get("candidate") or {}).get("experiment") or commit[:9]
    body = json.dumps({"verdict": verdict, **details}, default=str, sort_keys=True, indent=1)
    git("tag", "-a", tag, commit, "-m", f"{name}: {who} {verdict}\n\n{body}", cwd=project)
    tags.push_line(project, name)
    return tag


def decision_tags(project: Path, name: str | None = None) -> list[dict[str, Any]]:
    """Every decision tag of line `name`, oldest first: its tag, the candidate's commit, the
    verdict and the recorded details (the candidate's and the champion's experiments, who
    decided when)."""
    name, _ = artifact(project, name)
    listing = Snapshot(project).git(
        "for-each-ref",
        "--sort=refname",
        "--format=%(refname:short)%00%(*objectname)%00%(contents)%1e",
        "refs/tags/" + DECISIONS.format(name=name),
    )
    out = []
    for entry in filter(str.strip, listing.split("\x1e")):
        tag, commit, contents = entry.strip("\n").split("\x00", 2)
        subject, _, body = contents.partition("\n\n")
        try:
            details = json.loads(body.strip() or "{}")
        except ValueError:  # a tag written by hand: its subject only
            details = {}
        verdict = details.pop("verdict", None) or subject.removeprefix(f"{name}: ")
        out.append({"tag": tag, "commit": commit, "verdict": verdict, "line": name, **details})
    return out


def decisions(project: Path, name: str | None = None) -> dict[str, list[str]]:
    """{candidate commit: [verdict, ...]} from line `name`'s decision tags, oldest first."""
    out: dict[str, list[str]] = {}
    for d in decision_tags(project, name):
        out.setdefault(d["commit"], []).append(d["verdict"])
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m flows.registry",
        description="publish: push every line's registered versions that the default DVC "
        "remote lacks (a promotion made without a remote, or while it was down), and the "
        "registry's tags that the git remote origin lacks.",
    )
    parser.add_argument("command", choices=["publish"])
    parser.add_argument("--project", type=Path, default=Path("."), help="default: .")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        done = publish(args.project)
        pushed = tags.push_all(args.project, [x.name for x in lines.read(args.project)])
    except (RegistryError, lines.LineError, tags.TagPushError) as e:
        sys.exit(f"error: {e}")
    remote = default_remote(args.project)[0]  # publish() checked there is one
    for name, found in done.items():
        for commit, version in versions(args.project, name).items():
            n = found[version]
            state = "published" if n else "on the remote already"
            print(f"{name}@{version}: {state} ({n} files uploaded)")
            if remote not in (Snapshot(args.project, commit).text(".dvc/config") or ""):
                print(
                    f"  its commit predates the remote: `dvc artifacts get . {name} --rev "
                    f"{version} --remote {remote}` fetches it (so does --stage {STAGE} while "
                    "it is the champion)"
                )
        if not found:
            print(f"{name}: no registered version yet")
    if pushed is not None:
        print(f"git tags pushed to origin: {len(pushed)} ({', '.join(pushed) or 'all there'})")


if __name__ == "__main__":
    main()
