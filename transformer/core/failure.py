"""A stage's failure as a record the flows read: the exception's type, its message, the stage.

flows/shell.py points FAILURE_RECORD at a file of its own, outside the workspace (never a DVC
output), for each command it runs. A stage that ends with an exception writes there, so that a
run's state names the real cause (`torch.OutOfMemoryError: CUDA out of memory ...`), not DVC's
"failed to reproduce" wrapper nor a line a regex guessed. Unset (a stage run by hand, `dvc
repro`), nothing is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAILURE_RECORD = "TRANSFORMER_FAILURE_RECORD"
# EX_TEMPFAIL: "preempted, resume me": the train stage saved its update in progress
# (transformer/training/preempt.py), and the flows retry it with --resume (flows/shell.py)
PREEMPTED = 75


def type_name(error: BaseException) -> str:
    """The exception's class as code spells it: `torch.OutOfMemoryError`, `ValueError`."""
    kind = type(error)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def record(stage: str, error: BaseException) -> None:
    """Write `error` as the stage's failure record, where FAILURE_RECORD says (the first rank's
    to fail kept: the others' errors follow from it)."""
    path = os.environ.get(FAILURE_RECORD)
    if not path or Path(path).exists():
        return
    if isinstance(error, SystemExit):
        if error.code is None or isinstance(error.code, int):
            return  # a status says it (0, PREEMPTED: transformer/training/preempt.py)
        kind, message = "error", str(error.code).removeprefix("error: ")  # sys.exit("error: ...")
    else:
        kind, message = type_name(error), str(error)
    data: dict[str, Any] = {"stage": stage, "type": kind, "message": message}
    data["rank"] = int(os.environ.get("RANK", "0"))
    tmp = Path(f"{path}.{os.getpid()}.tmp")
    try:  # a courtesy to the flows: the stage's own error still propagates as it is
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass


def recorded(stage: str, main: Callable[[], None]) -> Callable[[], None]:
    """main() whose failure (any exception, sys.exit with a message) is recorded, then raised."""

    def run() -> None:
        try:
            main()
        except BaseException as e:
            record(stage, e)
            raise

    return run


def read(path: Path) -> dict[str, Any] | None:
    """A failure record, or None where the command wrote none (or an unreadable one)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and {"type", "message"} <= data.keys() else None


def cause(record: dict[str, Any]) -> str:
    """A record's cause on one line: "torch.OutOfMemoryError: CUDA out of memory ... (stage
    train)"; "error: ..." for a stage's own sys.exit message."""
    message = (str(record["message"]).strip().splitlines() or [""])[0][:500]
    where = f" (stage {record['stage']})" if record.get("stage") else ""
    return f"{record['type']}: {message}{where}"
