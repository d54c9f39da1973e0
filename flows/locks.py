"""The flows' locks: one flow run at a time per run workspace (the pipeline flow's, or a
line's), one promotion decision at a time per project. flock(2) locks under .dvc/tmp: freed
when the holding process dies, so a crashed run never leaves the next one waiting."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from flows.shell import logger
from flows.workspace import file_name

_held: set[Path] = set()


def lock_path(project: Path, line: str | None = None) -> Path:
    """The lock file of the run workspace of line `line` (None: the pipeline flow's)."""
    tmp = Path(project) / ".dvc" / "tmp"
    return (
        tmp / "flows.lock" if line is None else tmp / "flows" / "lines" / f"{file_name(line)}.lock"
    )


@contextlib.contextmanager
def workspace_lock(project: Path, line: str | None = None) -> Iterator[None]:
    """One flow at a time per run workspace: the pipeline flow's, or line `line`'s (re-entrant
    for subflows; freed if its process dies). Different lines run at once."""
    with _flock(lock_path(project, line), f"{project}: another flow run holds the workspace"):
        yield


@contextlib.contextmanager
def registry_lock(project: Path) -> Iterator[None]:
    """One promotion decision at a time per project (the registry's tags, the remotes)."""
    path = Path(project) / ".dvc" / "tmp" / "registry.lock"
    with _flock(path, f"{project}: another line's decision holds the registry"):
        yield


@contextlib.contextmanager
def experiments_lock(project: Path) -> Iterator[None]:
    """One `dvc exp save` at a time per repository: the lines' workspaces are worktrees of one
    git repository, and two saves at once race on its refs/exps (DVC's own lock is in each
    worktree's .dvc/tmp; seen as "'NoneType' object is not subscriptable")."""
    path = Path(project) / ".dvc" / "tmp" / "experiments.lock"
    with _flock(path, f"{project}: another line is saving its experiment"):
        yield


@contextlib.contextmanager
def _flock(path: Path, busy: str) -> Iterator[None]:
    if path in _held:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger().info("%s; waiting", busy)
            fcntl.flock(f, fcntl.LOCK_EX)
        _held.add(path)
        try:
            yield
        finally:
            _held.discard(path)
