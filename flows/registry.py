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
from flows.lineage import DOWNLOAD, EVALUATE, Snapshot, lineage
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


def next_version(project: Path, name: str) -> str:
    """The next major version of line `name` from the tags this clone has (origin's, once
    tags.sync ran)."""
    known = versions(project, name)
    major = max((int(v.lstrip("v").split(".")[0]) for v in known.values()), default=0)
    return f"v{major + 1}.0.0"


def register(
    project: Path, commit: str, summary: dict[str, Any], reason: str, name: str | None = None
) -> tuple[str, list[str]]:
    """Register `commit` as line `name`'s next version and assign it the production stage, in
    this clone's tags only (the decision pushes them, flows/promote.py); (the version, the tags
    made). Its data must be on the DVC remote first (push())."""
    name, _ = artifact(project, name)
    message = json.dumps({"reason": reason, **summary}, default=str, sort_keys=True)
    before = set(tags.line_tags(project, [name]))
    version = versions(project, name).get(commit) or (
        gto.api.register(
            str(project),
            name,
            commit,
            version=next_version(project, name),
            message=f"Registering {name}: {message}",
        ).version
    )
    gto.api.assign(
        str(project), name, STAGE, version=version, message=f"Promoting {name}: {message}"
    )
    return version, sorted(set(tags.line_tags(project, [name])) - before)


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
    """The artifact's data at `commit`, and what the gate reads of it (gate_paths()), to the
    project's default DVC remote as configured now (an older commit may predate it), tried
    `tries` times (a remote may be down a while), then checked there; the number of files
    uploaded (0: all there already), or None, with a warning, without a remote."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    remote = default_remote(project)
    if remote is None:
        logger().warning(NO_REMOTE)
        return None
    name, conf = remote
    targets = [path, *gate_paths(project, commit)]
    for attempt in range(1, tries + 1):
        try:
            with Repo(str(project), remote=name, remote_config=conf) as repo:
                n = push_checked(repo, targets, commit, name)
            break
        except (DvcException, OSError, RegistryError) as e:  # DVC's; the file system's
            if attempt == tries:
                raise RegistryError(f"pushing {path} of {commit[:9]} to {name!r}: {e}") from e
            logger().warning("pushing to %r failed (%s); trying again", name, e)
            time.sleep(delay_s * attempt)
    logger().info("pushed %s of %s to the DVC remote %r (%d new files)", path, commit[:9], name, n)
    return n


def push_checked(repo: Any, targets: list[str], commit: str, name: str) -> int:
    """`dvc push` of `targets` at `commit`, then the remote itself asked for each file: a
    promotion trusts no push it has not seen land. What DVC's push skipped (its index of the
    remote can believe, after a failed push, that files are there) is sent object by object;
    RegistryError if anything is still missing."""
    n = repo.push(targets=targets, revs=[commit], workspace=False, remote=name)
    objs = used(repo, targets, commit, name)
    status = repo.cloud.status(objs, remote=name)
    if lost := {*status.missing, *status.new}:
        n += len(repo.cloud.push(lost, remote=name).transferred)
        status = repo.cloud.status(objs, remote=name)
        if lost := {h.value for h in (*status.missing, *status.new)}:
            raise RegistryError(
                f"{len(lost)} file(s) still missing on the DVC remote {name!r} after the push "
                f"({', '.join(sorted(lost)[:3])}...)"
            )
    return n


def used(repo: Any, targets: list[str], commit: str, remote: str | None = None) -> set:
    """The DVC objects (files and directory listings) of `targets` at `commit`, that commit
    alone (DVC's Repo.used_objs adds the workspace, which may lack them)."""
    out: set = set()
    for _ in repo.brancher(revs=[commit], workspace=False):
        for objs in repo.index.used_objs(targets, remote=remote, force=True).values():
            out |= objs
    return out


def gate_paths(project: Path, commit: str) -> list[str]:
    """What another machine's gate reads of the experiment at `commit` besides the package:
    every stage's metrics, the evaluate stage's hypotheses and the download stage's references
    (DVC-tracked; checkpoints and shards stay on the machine that trained)."""
    dag = read_dag(project, rev=commit)
    uncached = {p for s in dag.values() for p in s.uncached}
    found = [m for s in dag.values() for m in s.metrics]
    for name in (EVALUATE, DOWNLOAD):
        found += list(dag[name].outs) if name in dag else []
    return [p for p in dict.fromkeys(found) if p not in uncached]


def cached(project: Path, path: str, commit: str) -> bool:
    """Whether this clone's DVC cache holds all of `path` at `commit` (so it can publish it)."""
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        try:
            objs = used(repo, [path, *gate_paths(project, commit)], commit)
        except Exception:  # noqa: BLE001 (DVC's many errors: nothing to publish from here)
            return False
        return all(repo.cache.local.exists(h.value) for h in objs)


def publish(project: Path) -> dict[str, dict[str, int | None]]:
    """Every line's registered versions' data that this clone holds to the default DVC remote
    (what a promotion without a remote, or with the remote down, left behind); {line: {version:
    files uploaded, None where this clone's cache lacks it (another machine made it)}}."""
    if default_remote(project) is None:
        raise RegistryError(NO_REMOTE)
    return {
        x.name: {
            v: (push(project, x.path, c) or 0) if cached(project, x.path, c) else None
            for c, v in versions(project, x.name).items()
        }
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


def record_decision(
    project: Path, commit: str, verdict: str, details: dict[str, Any], name: str | None = None
) -> str:
    """An annotated tag `decision/NAME/NNNN` on the candidate's commit, in this clone (the
    decision pushes it, flows/promote.py): the candidate and the verdict on its first line,
    `details` (JSON) below. GTO's tags record promotions only; these record refusals too, so
    `git tag -n` tells the registry's whole history. The tag's name."""
    name, _ = artifact(project, name)
    prefix = tags.DECISIONS.format(name=name)
    numbers = [t.removeprefix(prefix) for t in tags.line_tags(project, [name])]
    n = max((int(x) for x in numbers if x.isdigit()), default=0) + 1
    tag = f"{prefix}{n:04d}"
    who = (details.get("candidate") or {}).get("experiment") or commit[:9]
    body = json.dumps({"verdict": verdict, **details}, default=str, sort_keys=True, indent=1)
    git("tag", "-a", tag, commit, "-m", f"{name}: {who} {verdict}\n\n{body}", cwd=project)
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
        "refs/tags/" + tags.DECISIONS.format(name=name),
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


def unpublished(project: Path, name: str | None = None) -> list[str]:
    """The commits of line `name` whose latest decision won the gate but could not publish the
    package (no production tag was made): the line's next decision, or `python -m
    flows.registry publish`, decides them again."""
    last = {d["commit"]: d for d in decision_tags(project, name)}
    return [commit for commit, d in last.items() if d.get("unpublished")]


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
        "remote lacks (a promotion made without a remote, or while it was down), decide again "
        "each candidate that won the gate while its package could not be published, and push "
        "the registry's tags that the git remote origin lacks.",
    )
    parser.add_argument("command", choices=["publish"])
    parser.add_argument("--project", type=Path, default=Path("."), help="default: .")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        done = publish(args.project)
        from flows import decision  # it imports this module

        completed = decision.complete(args.project)
        pushed = tags.push_all(args.project, [x.name for x in lines.read(args.project)])
    except (RegistryError, lines.LineError, tags.TagPushError) as e:
        sys.exit(f"error: {e}")
    for out in completed:
        verdict = f"promoted as {out['version']}" if out["promoted"] else "not promoted"
        print(
            f"{out['line']}: {out['candidate'].get('experiment_commit', '')[:9]} {verdict}: "
            f"{out['reason']}"
        )
    remote = default_remote(args.project)[0]  # publish() checked there is one
    for name, found in done.items():
        for commit, version in versions(args.project, name).items():
            if version not in found:  # registered just now by complete(), printed below
                continue
            n = found[version]
            if n is None:
                print(
                    f"{name}@{version}: not in this clone's DVC cache (the machine that made "
                    "it publishes it)"
                )
                continue
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
