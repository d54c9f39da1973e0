"""A stage's failure record (transformer/core/failure.py), as the flows read it (flows/shell.py):
a real stage's own error recorded with its stage, a dotted exception named in full, and a
command without a record still named by its last error line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.shell import CommandError, run
from transformer.core.failure import FAILURE_RECORD

ROOT = Path(__file__).resolve().parents[1]


def test_a_real_stage_records_its_error_with_its_stage(tmp_path: Path) -> None:
    record = tmp_path / "failure.json"
    env = {**os.environ, FAILURE_RECORD: str(record)}
    missing = tmp_path / "no-checkpoints"
    r = subprocess.run(
        [sys.executable, "-m", "transformer.average", str(missing), str(tmp_path / "out.pt")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode != 0
    data = json.loads(record.read_text())
    assert data["stage"] == "average" and data["rank"] == 0, data
    assert str(missing) in data["message"] and data["type"], data


RAISES = (
    "from transformer.core import failure\n"
    "E = type('OutOfMemoryError', (RuntimeError,), {'__module__': 'torch'})\n"
    "def main():\n"
    "    raise E('CUDA out of memory. Tried to allocate 20.00 MiB')\n"
    "failure.recorded('train', main)()\n"
)


def test_a_dotted_exception_is_the_commands_cause(tmp_path: Path) -> None:
    with pytest.raises(CommandError) as e:
        run([sys.executable, "-c", RAISES], cwd=ROOT, what="stage train")
    first = str(e.value).splitlines()[0]
    assert first == (
        "stage train failed: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "20.00 MiB (stage train)"
    )
    assert e.value.record == {
        "stage": "train",
        "type": "torch.OutOfMemoryError",
        "message": "CUDA out of memory. Tried to allocate 20.00 MiB",
        "rank": 0,
    }


def test_without_a_record_the_last_error_line_names_a_dotted_exception(tmp_path: Path) -> None:
    code = "import sys; print('torch.OutOfMemoryError: CUDA out of memory'); sys.exit(1)"
    with pytest.raises(CommandError) as e:
        run([sys.executable, "-c", code], cwd=ROOT, what="stage train")
    assert e.value.record is None
    assert str(e.value).startswith("stage train failed: torch.OutOfMemoryError: CUDA out of")
