"""`python -m flows.promote`'s command line: a bad project is a clear error, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_missing_params_file_is_named(tmp_path: Path) -> None:
    """Checked before any flow run starts (no Prefect server is needed to say it)."""
    r = subprocess.run(
        [sys.executable, "-m", "flows.promote", "some-experiment", "--project", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode != 0
    assert f"error: {tmp_path / 'params.yaml'}: no such params file" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
