"""Commands the flows run: `dvc` and `python -m transformer.config`, streamed into the run's logs.

Each command runs in a process group of its own, killed when the flow stops waiting for it
(an exception, Ctrl-C, a cancelled run). Its output reaches the Prefect logs line by line,
except progress-bar refreshes (lines ended by a carriage return, or a bar a later line was
printed after), of which at most one per PROGRESS_EVERY_S seconds is logged, blank lines, and
DVC's git advice, which does not apply to a workspace the flows own; an indented JSON object
(metrics) is one line: a 100k-step training run then writes hundreds of lines, not 100k. A
failed command is named by the failure record its stage wrote (transformer/core/failure.py),
else by its last error line (CAUSE).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformer.core.failure import FAILURE_RECORD, PREEMPTED
from transformer.core.failure import cause as failure_cause
from transformer.core.failure import read as read_record

LOCK_BUSY = ("Unable to acquire lock", "is busy, it is being blocked by")
# causes worth a retry: killed by a signal (OOM, a dying machine), a full disk, the network,
# a run-cache race
TRANSIENT = re.compile(
    r"No space left on device|Errno 28|Out of diskspace|Connection (reset|refused|aborted)|"
    r"timed out|Temporary failure|"
    # the stage's own process killed: DVC says "exited with -9" when its shell exec'd the
    # command and "exited with 137" (128 + 9) when a shell waited for it; torchrun "exitcode : -9"
    r"exited with (-(9|15)|137|143)\b|exitcode\s*:\s*-(9|15)\b|Signal (9|15) \(SIG(KILL|TERM)\)|"
    # two workspaces (lines run at once) repro the same stage into the one cache: DVC 3's run
    # cache lets one's reader delete the other's half-written temporary entry as corrupted, and
    # the writer fails on the file gone; the stage's outputs were made, a retry completes it
    r"No such file or directory: '[^']*/runs/[0-9a-f]{2}/[0-9a-f]{64}/"
)
# the train stage's "preempted, resume me" (PREEMPTED: SIGTERM / SIGUSR1 to it, or a cancelled
# run's stop): it saved the update in progress, and --resume goes on from it
EXITED_PREEMPTED = re.compile(rf"exited with {PREEMPTED}\b")
# the fallback where a command wrote no failure record (transformer/core/failure.py): its last
# error line, dotted exception names included (torch.OutOfMemoryError: ...)
CAUSE = re.compile(r"^(error|ERROR|fatal)\b|^[\w.]*(Error|Exception): ")
WRAPPER = re.compile(r"^ERROR: failed to reproduce ")  # DVC's summary of the stage's own error
ADVICE = re.compile(
    r"^(To track the changes with git, run:|To enable auto staging, run:|\s+git add |"
    r"\s+dvc config core\.autostage true|Use `dvc push` to send your updates to remote storage\.)"
)
PROGRESS_EVERY_S = 60.0
# a stopped command's time to exit before SIGKILL: the train stage saves its update in progress
# (a preemption notice); under the 30 s Prefect's runner gives a cancelled flow run's process
STOP_GRACE_S = 25.0
_running: set[subprocess.Popen] = set()  # the commands in flight, for the orphan watch
_orphaned = threading.Event()  # set by the orphan watch: the flow run is ending, no state from here
_stopping = threading.Event()  # set by stop_all: the flow run is ending, no command starts


class Stopped(RuntimeError):
    """A command stopped, or never started, because its flow run is ending (cancelled, Ctrl-C,
    its serving process gone): no failure of the command's own, nothing to retry."""


class CommandError(RuntimeError):
    """A command exited non-zero. The message's first line names the cause: the last error line
    of its output (the run's state message, what `python -m flows.run --wait` prints)."""

    def __init__(
        self,
        what: str,
        cmd: list[str],
        code: int,
        tail: list[str],
        record: dict[str, Any] | None = None,
    ):
        self.lock_busy = any(m in line for line in tail for m in LOCK_BUSY)
        judged = without_stopped_ranks(tail)
        self.transient = (
            code < 0
            or code in (128 + 9, 128 + 15)
            or any(TRANSIENT.search(line) for line in judged)
        )
        self.preempted = code == PREEMPTED or any(EXITED_PREEMPTED.search(t) for t in tail)
        self.record = record  # the stage's own account of its failure, where it wrote one
        self.cause = failure_cause(record) if record else cause(tail) or f"exit status {code}"
        if self.preempted:
            self.cause = f"exit {PREEMPTED}: it saved its update in progress, a retry resumes it"
        super().__init__(
            f"{what} {'preempted' if self.preempted else 'failed'}: {self.cause}\n"
            f"`{' '.join(cmd)}` exited with {code}:\n" + "\n".join(tail[-20:])
        )


def without_stopped_ranks(lines: list[str]) -> list[str]:
    """`lines` less torchrun's "Failures:" list: the ranks its agent stopped (SIGTERM) once one
    rank failed. Their -15 says nothing of the failure; the "Root Cause" entry after it does."""
    kept, stopped = [], False
    for line in lines:
        if line.strip() == "Failures:":
            stopped = True
        elif line.startswith("Root Cause"):
            stopped = False
        if not stopped:
            kept.append(line)
    return kept


def cause(lines: list[str]) -> str:
    """The last line of `lines` that states an error (a CLI's "error: ..." or an exception),
    the stage's own before DVC's summary of it."""
    errors = [line.strip() for line in lines if CAUSE.search(line.strip())]
    own = [line for line in errors if not WRAPPER.search(line)]
    return (own or errors or [line.strip() for line in lines if line.strip()] or [""])[-1]


def logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow or task, a plain logger elsewhere."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("flows")


def segments(stream) -> Iterator[tuple[str, bool]]:
    """(text, is_progress) for each line of a binary stream; a segment that ends with a lone
    carriage return is a progress-bar refresh (tqdm rewrites its line that way)."""
    buf = b""
    while chunk := stream.read1(65536):
        buf += chunk
        while m := re.search(rb"\r\n|\n|\r(?!$)", buf):
            text, end = buf[: m.start()], m.group()
            buf = buf[m.end() :]
            yield text.decode(errors="replace"), end == b"\r"
    if buf:
        yield buf.rstrip(b"\r").decode(errors="replace"), False


# a progress bar's refresh (tqdm: "| 100/600 [00:27<02:15, ...]") with a line printed after it
# on the same terminal line, as a stage's print() lands after its bar's last refresh
GLUED = re.compile(r"^(?P<bar>.*?\d+(?:/\d+)?\s?\w* \[\d+:\d\d[^\]]*\])(?P<rest>\S.*)$")
# a line written over a bar that was cleared with spaces (tqdm, interrupted by a log message)
CLEARED = re.compile(r"^ {40,}(?=\S)")
JSON_LINES = 2000  # the longest indented JSON block joined into one log line
NUMBERS = re.compile(r"\d+(?:\.\d+)?")  # what differs between repeats of one message


class Output:
    """What of a command's output reaches the log: its lines, except blank ones and DVC's git
    advice; progress-bar refreshes, and repeats of one message (numbers aside: a warning each
    log step), at most one per `every_s`; an indented JSON object (the stages print their
    metrics so) as one line."""

    def __init__(self, log, every_s: float):
        self.log, self.every_s = log, every_s
        self.shown = -float("inf")
        self.block: list[str] = []  # an indented JSON object's lines so far
        self.seen: dict[str, float] = {}  # message, numbers masked -> when last logged

    def progress(self, text: str) -> None:
        if text.strip() and time.monotonic() - self.shown >= self.every_s:
            self.shown = time.monotonic()
            self.log.info("%s", text.strip())

    def line(self, text: str) -> None:
        if self.block or text == "{":
            self.block.append(text)
            if text == "}" or len(self.block) > JSON_LINES:
                self.flush()
            return
        if glued := GLUED.match(text):
            self.progress(glued["bar"])
            text = glued["rest"]
        text = CLEARED.sub("", text)
        if text.strip() and not ADVICE.search(text) and not self.repeated(text):
            self.log.info("%s", text)

    def repeated(self, text: str) -> bool:
        """Whether the message, numbers aside, was logged less than `every_s` ago."""
        key, now = NUMBERS.sub("#", text), time.monotonic()
        if now - self.seen.get(key, -float("inf")) < self.every_s:
            return True
        if len(self.seen) > 10_000:  # a long run's many distinct lines: forget the old
            self.seen.clear()
        self.seen[key] = now
        return False

    def flush(self) -> None:
        block, self.block = self.block, []
        try:
            self.log.info("%s", json.dumps(json.loads("\n".join(block)), ensure_ascii=False))
        except ValueError:  # not JSON after all: as it came
            for text in block:
                if text.strip():
                    self.log.info("%s", text)


def command_line(cmd: list[str]) -> str:
    """`cmd` as one line that a shell runs as it is: shlex's quoting, and bash's $'...' for an
    argument with line breaks (a commit message), so the echo is one log line."""

    def quote(arg: str) -> str:
        if "\n" not in arg:
            return shlex.quote(arg)
        escaped = arg.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
        return f"$'{escaped}'"

    return " ".join(quote(a) for a in cmd)


def run(
    cmd: list[str], cwd: Path, what: str = "", progress_every_s: float = PROGRESS_EVERY_S
) -> list[str]:
    """Run `cmd` in `cwd`, logging its output as it comes; its lines, or CommandError."""
    if _stopping.is_set():
        raise Stopped(f"{what or command_line(cmd)}: not started, the flow run is ending")
    log = logger()
    log.info("$ %s", command_line(cmd))
    # outside the workspace: no DVC output, nothing git sees; one per command
    records = Path(tempfile.mkdtemp(prefix="stage-failure-"))
    record = records / "failure.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", FAILURE_RECORD: str(record)}
    lines: list[str] = []
    out = Output(log, progress_every_s)
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,  # PYTHONUNBUFFERED: stage output reaches the logs as it is printed
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except BaseException:
        shutil.rmtree(records, ignore_errors=True)
        raise
    _running.add(proc)
    try:
        for text, progress in segments(proc.stdout):
            if progress:
                out.progress(text)
                continue
            lines.append(text)
            out.line(text)
        if out.block:
            out.flush()
        proc.wait()
    finally:
        stop_group(proc)
        _running.discard(proc)
        failed = read_record(record)
        shutil.rmtree(records, ignore_errors=True)
    if proc.returncode and _orphaned.is_set():
        threading.Event().wait()  # stopped by the orphan watch, which reports and exits
    if proc.returncode and _stopping.is_set():
        raise Stopped(f"{what or command_line(cmd)}: stopped (exit {proc.returncode})")
    if proc.returncode:
        raise CommandError(what or " ".join(cmd[:4]), cmd, proc.returncode, lines, failed)
    return lines


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL, the command's process group, unless it has already ended. The
    whole group is waited for, not only `dvc` at its head, which dies of SIGTERM at once: the
    train stage under it takes that long to save its update in progress."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _group_alive(proc):
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + grace_s
        while _group_alive(proc) and time.monotonic() < deadline:
            time.sleep(0.05)
    if proc.stdout:
        proc.stdout.close()


def _group_alive(proc: subprocess.Popen) -> bool:
    """Whether any process of the command's group is left (its head reaped first: a zombie
    still counts as a member)."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch_parent(on_orphaned, every_s: float = 2.0) -> None:
    """Call on_orphaned(parent pid) from a daemon thread once this process's parent (the
    `flows.serve` process or the worker that started the flow run) has died. Without this a
    flow run outlives it, blocked on a silent stage, unseen by anyone."""
    parent = os.getppid()

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        _orphaned.set()
        on_orphaned(parent)

    threading.Thread(target=loop, name="orphan-watch", daemon=True).start()


def stop_all() -> None:
    """Stop every command in flight (their process groups), and start none after."""
    _stopping.set()
    for proc in list(_running):
        stop_group(proc)


def stopping(timeout_s: float = 0.0) -> bool:
    """Whether the flow run is ending (stop_all), waiting up to `timeout_s` for it to."""
    return _stopping.wait(timeout_s)


def dvc(*args: str, cwd: Path, what: str = "") -> list[str]:
    """`dvc ARGS` with the venv's dvc (the one beside this interpreter)."""
    return run([sys.executable, "-m", "dvc", *args], cwd, what or f"dvc {args[0]}")


def config(project: Path, *args: str) -> list[str]:
    """`python -m transformer.config ARGS` in `project` (a run workspace: the code of the run's
    revision, not this process's, decides); its output, or a ConfigError with its message."""
    from transformer.core.settings import ConfigError

    try:
        return run(
            [sys.executable, "-m", "transformer.config", *args], project, f"config {args[0]}"
        )
    except CommandError as e:
        if e.transient:
            raise
        raise ConfigError(e.cause.removeprefix("error: ")) from None


def read_section(project: Path, section: str) -> dict[str, Any]:
    """Section `section` of the project's params.yaml as its own code validates it."""
    params = str(Path(project).resolve() / "params.yaml")  # named in full in an error
    return json.loads(config(project, "show", section, "--params", params)[-1])


def apply_params(project: Path, preset: str | None, overrides: list[str]) -> None:
    """Write preset `preset` to params.yaml, then the `dvc exp run -S` overrides, then validate,
    each with the project's own code (the run's revision). Every override's key is checked
    first: a typo changes nothing."""
    if overrides:
        config(project, "keys", *(o.split("=", 1)[0].lstrip("+~") for o in overrides))
    if preset:
        config(project, "preset", preset)
    if overrides:
        from dvc.utils.hydra import apply_overrides  # the very code behind `dvc exp run -S`

        apply_overrides(project / "params.yaml", list(overrides))
        logger().info("params.yaml: set %s", ", ".join(overrides))
    config(project, "check")  # a bad value fails here, before any stage


def check_override(override: str) -> None:
    """ConfigError naming an override's key when params.yaml's schema has no such key.

    Hydra would refuse it too, but with a hint to add it (`+train.max_step=...`), which the
    stages would then refuse as an unknown key.
    """
    from transformer.core.presets import check_key

    check_key(override.split("=", 1)[0].lstrip("+~"), f"override {override!r}")
