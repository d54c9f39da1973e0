"""`python -m transformer.X ARGS` as a process forked from one that has imported torch once.

A train run in these tests costs ~6.5 s of CPU, ~4 s of it importing torch (a /proc sampler of
the whole suite: 62 runs, 402 s), and ~2.5 s more importing torch._dynamo (which torch.optim's
first optimizer imports) and dvclive. A multiprocessing forkserver imports all three once per
test process and forks each run from it: the run is a process of its own (its own pid,
signals, exit status and environment, its output in a file), and runs the module as `python -m`
does (`runpy`, `__name__ == "__main__"`), without starting an interpreter. Tests of what only a
fresh interpreter shows (torchrun's ranks, the stages under `dvc repro`) start real processes.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["transformer.train", "torch._dynamo", "dvclive"])


def _child(module: str, argv: list[str], cwd: str, env: dict[str, str], logs: list[str]) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # the forkserver ignores Ctrl-C for itself; a run handles it as the CLI does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    fds = [os.open(log, os.O_WRONLY) for log in logs]
    os.dup2(fds[0], 1)
    os.dup2(fds[-1], 2)  # the same file as stdout when merged
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    # runpy's note that the module was preloaded: `python -m` would have imported it afresh
    warnings.filterwarnings("ignore", "'transformer", RuntimeWarning, "runpy")
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class Forked:
    """A started run, with the part of `subprocess.Popen` the tests use."""

    def __init__(
        self, module: str, argv: list[str], cwd: Path, env: dict[str, str] | None, merged: bool
    ):
        self._logs = []
        for stream in ("out",) if merged else ("out", "err"):
            fd, path = tempfile.mkstemp(prefix=f"forked-{stream}-")
            os.close(fd)
            self._logs.append(path)
        env = {**os.environ, **(env or {})}
        args = (module, [str(a) for a in argv], str(cwd), env, self._logs)
        self._process = _CONTEXT.Process(target=_child, args=args)
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode  # -N when signal N ended it, as Popen's

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Wait for the run to end (killing it past `timeout`): its stdout and stderr (None when
        merged into stdout, as Popen's `stderr=STDOUT`)."""
        self._process.join(timeout)
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join()
            raise TimeoutError(f"{self._process.name} still running after {timeout} s")
        texts = [Path(log).read_text(errors="replace") for log in self._logs]
        for log in self._logs:
            os.unlink(log)
        return texts[0], texts[1] if len(texts) == 2 else None


def start(
    module: str, *argv: str | Path, cwd: Path = ROOT, env: dict | None = None, merged: bool = False
) -> Forked:
    return Forked(module, list(argv), cwd, env, merged)


def run(
    module: str, *argv: str | Path, cwd: Path = ROOT, env: dict | None = None
) -> tuple[int, str, str]:
    """Run to the end (5 minutes at most): (exit status, stdout, stderr)."""
    proc = start(module, *argv, cwd=cwd, env=env)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err
