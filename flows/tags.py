"""The registry's git tags on the team's git remote `origin`: one truth for every machine.

A line's tags are its versions (`NAME@vX.Y.Z`), its stage assignments (`NAME#prod#N`) and its
decisions (`decision/NAME/NNNN`). A decision is a transaction against origin (flows/promote.py):
sync() first brings origin's tags of the line here, so versions and decisions are numbered from
origin's view; the new tags are then pushed together with `git push --atomic`, so either all of
them reach origin or none does. A push refused because another machine took a name is a
Rejected (the caller decides again); an origin that cannot be reached is an Unreachable (the
caller fails closed); a tag that origin holds with another object than this clone is a Conflict
naming both commits, never skipped.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from flows.shell import logger

REMOTE = "origin"
DECISIONS = "decision/{name}/"  # the tag prefix of every promotion decision of line `name`


class TagPushError(RuntimeError):
    pass


class Unreachable(TagPushError):
    """origin could not be asked (down, offline, credentials)."""


class Rejected(TagPushError):
    """origin refused the push: another machine pushed a tag of the same name first."""


class Conflict(TagPushError):
    """A tag that origin holds with another object than this clone."""


def _git(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=project, capture_output=True, text=True, check=False, timeout=300
    )


def has_remote(project: Path) -> bool:
    return _git(project, "remote", "get-url", REMOTE).returncode == 0


def url(project: Path) -> str:
    return _git(project, "remote", "get-url", REMOTE).stdout.strip()


def is_line_tag(tag: str, name: str) -> bool:
    return tag.startswith((f"{name}@", f"{name}#", DECISIONS.format(name=name)))


def line_tags(project: Path, names: list[str]) -> list[str]:
    """The local registry tags of lines `names`."""
    listing = _git(project, "tag", "--list").stdout.split()
    return [t for t in listing if any(is_line_tag(t, n) for n in names)]


def _refs(text: str) -> dict[str, tuple[str, str]]:
    """{tag: (object, commit)} from `git ls-remote`/`show-ref -d` output (the peeled `^{}` line
    gives an annotated tag's commit)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        sha, _, ref = line.partition("\t" if "\t" in line else " ")
        if not ref.startswith("refs/tags/"):
            continue
        tag = ref.removeprefix("refs/tags/")
        if tag.endswith("^{}"):
            out.setdefault(tag[:-3], [sha, sha])[1] = sha
        else:
            out.setdefault(tag, [sha, sha])[0] = sha
    return {t: (o, c) for t, (o, c) in out.items()}


def remote_refs(project: Path) -> dict[str, tuple[str, str]]:
    """{tag: (object, commit)} of every tag on origin; Unreachable naming origin if it can't."""
    r = _git(project, "ls-remote", "--tags", REMOTE)
    if r.returncode:
        raise Unreachable(
            f"git remote {REMOTE!r} ({url(project)}) cannot be reached: {r.stderr.strip()}"
        )
    return _refs(r.stdout)


def local_refs(project: Path) -> dict[str, tuple[str, str]]:
    return _refs(_git(project, "show-ref", "--tags", "-d").stdout)


def sync(project: Path, name: str) -> list[str]:
    """Bring origin's tags of line `name` here; the tags this clone has that origin lacks (its
    pending ones, pushed with the next decision). Conflict where a tag differs."""
    theirs = {t: v for t, v in remote_refs(project).items() if is_line_tag(t, name)}
    mine = {t: v for t, v in local_refs(project).items() if is_line_tag(t, name)}
    for tag in sorted(set(theirs) & set(mine)):
        if theirs[tag][0] != mine[tag][0]:
            raise Conflict(
                f"tag {tag} is {theirs[tag][1][:9]} on {REMOTE} ({url(project)}) but "
                f"{mine[tag][1][:9]} in {project}: two machines decided apart. Keep origin's "
                f"(`git tag -d {tag}`, then decide again) or settle it by hand"
            )
    missing = sorted(set(theirs) - set(mine))
    if missing:
        r = _git(
            project,
            "fetch",
            "-q",
            "--no-tags",
            REMOTE,
            *(f"refs/tags/{t}:refs/tags/{t}" for t in missing),
        )
        if r.returncode:
            raise Unreachable(
                f"fetching {len(missing)} tag(s) of {name} from {REMOTE}: {r.stderr.strip()}"
            )
    return sorted(set(mine) - set(theirs))


def push_atomic(project: Path, tags: list[str]) -> None:
    """Push `tags` to origin all together or not at all (git push --atomic). Rejected when
    origin refused (a name taken meanwhile), Unreachable when it could not be asked."""
    if not tags:
        return
    r = _git(
        project,
        "push",
        "--atomic",
        "--porcelain",
        REMOTE,
        *(f"refs/tags/{t}:refs/tags/{t}" for t in tags),
    )
    if r.returncode == 0:
        logger().info("pushed %d tag(s) to %s: %s", len(tags), REMOTE, tags)
        return
    # --porcelain prints a line per ref: "!" refused by origin; nothing when it was unreachable
    if any(line.startswith("!") for line in r.stdout.splitlines()):
        raise Rejected(f"{REMOTE} refused {tags}: {(r.stdout + r.stderr).strip()}")
    raise Unreachable(f"pushing to {REMOTE} ({url(project)}): {r.stderr.strip()}")


def delete_local(project: Path, tags: list[str]) -> None:
    if tags:
        _git(project, "tag", "-d", *tags)


def push_all(
    project: Path, names: list[str], tries: int = 3, delay_s: float = 2.0
) -> list[str] | None:
    """Push the tags of lines `names` that origin lacks (each line synced first: a Conflict is
    raised, never skipped); those pushed, or None when the project has no remote `origin`.
    TagPushError after the last failure."""
    if not has_remote(project):
        return None
    for attempt in range(1, tries + 1):
        try:
            missing = [t for n in names for t in sync(project, n)]
            push_atomic(project, missing)
            return missing
        except Conflict:
            raise
        except (TagPushError, OSError, subprocess.TimeoutExpired) as e:
            error = e
        if attempt == tries:
            raise TagPushError(f"pushing the registry's tags to {REMOTE!r} failed: {error}")
        logger().warning("pushing tags to %s failed (%s); trying again", REMOTE, error)
        time.sleep(delay_s * attempt)
    return None
