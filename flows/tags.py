"""The registry's git tags on the team's git remote `origin`, as GTO's `--push` puts them there.

A line's tags are its versions (`NAME@vX.Y.Z`), its stage assignments (`NAME#prod#N`) and its
decisions (`decision/NAME/NNNN`). After each promotion and decision the line's tags that origin
lacks are pushed, so a push that failed before (the remote down) goes with the next one;
`python -m flows.registry publish` pushes every line's. A push is tried a few times; the last
failure is a TagPushError, which the registry logs as a warning: the tags stand locally.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from flows.shell import logger

REMOTE = "origin"


class TagPushError(RuntimeError):
    pass


def _git(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=project, capture_output=True, text=True, check=False, timeout=300
    )


def has_remote(project: Path) -> bool:
    return _git(project, "remote", "get-url", REMOTE).returncode == 0


def line_tags(project: Path, names: list[str]) -> list[str]:
    """The local registry tags of lines `names`."""
    listing = _git(project, "tag", "--list").stdout.split()
    return [t for t in listing for n in names if t.startswith((f"{n}@", f"{n}#", f"decision/{n}/"))]


def remote_tags(project: Path) -> set[str]:
    r = _git(project, "ls-remote", "--tags", REMOTE)
    if r.returncode:
        raise TagPushError(f"git ls-remote {REMOTE} (in {project}): {r.stderr.strip()}")
    return {
        ref.removeprefix("refs/tags/")
        for ref in (line.split("\t")[-1] for line in r.stdout.splitlines())
        if not ref.endswith("^{}")
    }


def push_all(
    project: Path, names: list[str], tries: int = 3, delay_s: float = 2.0
) -> list[str] | None:
    """Push the tags of lines `names` that origin lacks, tried `tries` times; those pushed, or
    None when the project has no remote `origin`. TagPushError after the last failure."""
    if not has_remote(project):
        return None
    for attempt in range(1, tries + 1):
        try:
            missing = sorted(set(line_tags(project, names)) - remote_tags(project))
            if not missing:
                return []
            r = _git(project, "push", REMOTE, *(f"refs/tags/{t}" for t in missing))
            if r.returncode == 0:
                logger().info("pushed %d tag(s) to %s: %s", len(missing), REMOTE, missing)
                return missing
            error = r.stderr.strip()
        except (TagPushError, OSError, subprocess.TimeoutExpired) as e:
            error = str(e)
        if attempt == tries:
            raise TagPushError(f"pushing the registry's tags to {REMOTE!r} failed: {error}")
        logger().warning("pushing tags to %s failed (%s); trying again", REMOTE, error)
        time.sleep(delay_s * attempt)
    return None


def push_line(project: Path, name: str) -> list[str] | None:
    """push_all() for line `name`, its failure a warning (the tags stand here; the line's next
    decision or `python -m flows.registry publish` pushes them)."""
    try:
        return push_all(project, [name])
    except TagPushError as e:
        logger().warning(
            "%s; the tags stand in %s, and the next decision of %s or `python -m "
            "flows.registry publish` pushes them",
            e,
            project,
            name,
        )
        return None
