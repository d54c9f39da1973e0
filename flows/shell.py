"""Commands the flows run in the project: `dvc` and `python -m transformer.config`, streamed live.

Every command's output goes line by line into the Prefect run's logs while it runs. The flows
change the project only through these commands, so what a Prefect run leaves is exactly what the
same commands typed in a shell leave.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

LOCK_BUSY = ("Unable to acquire lock", "is busy, it is being blocked by")


class CommandError(RuntimeError):
    """A command exited non-zero; the message holds its last lines of output."""

    def __init__(self, cmd: list[str], code: int, tail: list[str]):
        self.lock_busy = any(m in line for line in tail for m in LOCK_BUSY)
        super().__init__(f"`{' '.join(cmd)}` exited with {code}:\n" + "\n".join(tail[-20:]))


def logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow or task, a plain logger elsewhere."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("flows")


def run(cmd: list[str], cwd: Path) -> list[str]:
    """Run `cmd` in `cwd`, logging each output line as it comes; its lines, or CommandError."""
    log = logger()
    log.info("$ %s", " ".join(cmd))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # stage output reaches the logs as it is printed
    with subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
    ) as proc:
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            log.info("%s", lines[-1])
    if proc.returncode:
        raise CommandError(cmd, proc.returncode, lines)
    return lines


def dvc(*args: str, cwd: Path) -> list[str]:
    """`dvc ARGS` with the venv's dvc (the one beside this interpreter)."""
    return run([sys.executable, "-m", "dvc", *args], cwd)


def apply_params(project: Path, preset: str | None, overrides: list[str]) -> None:
    """Write preset `preset` to params.yaml, then the `dvc exp run -S` overrides, then validate."""
    if preset:
        run([sys.executable, "-m", "transformer.config", "preset", preset], project)
    if overrides:
        from dvc.utils.hydra import apply_overrides  # the very code behind `dvc exp run -S`

        for override in overrides:
            check_override(override)
        apply_overrides(project / "params.yaml", list(overrides))
        logger().info("params.yaml: set %s", ", ".join(overrides))
    from transformer.config import load_all

    load_all(project / "params.yaml")  # a typo in an override fails here, before any stage


def check_override(override: str) -> None:
    """ConfigError naming an override's key when params.yaml's schema has no such key.

    Hydra would refuse it too, but with a hint to add it (`+train.max_step=...`), which the
    stages would then refuse as an unknown key.
    """
    from transformer.config import check_key

    check_key(override.split("=", 1)[0].lstrip("+~"), f"override {override!r}")


_held: set[Path] = set()


@contextlib.contextmanager
def workspace_lock(project: Path) -> Iterator[None]:
    """One flow at a time per project directory (re-entrant for subflows; freed if killed)."""
    if project in _held:
        yield
        return
    lock_dir = project / ".dvc" / "tmp"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "flows.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger().info("%s: another flow run holds the workspace; waiting", project)
            fcntl.flock(f, fcntl.LOCK_EX)
        _held.add(project)
        try:
            yield
        finally:
            _held.discard(project)
