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


def test_the_registry_imports_gto_before_any_flow_run() -> None:
    """Importing gto runs logging.config.dictConfig, which flushes every log handler: inside a
    flow run that has logged, Prefect's API handler then waits for its queue (~2.5 s, twice per
    promotion before flows.registry imported gto with itself)."""
    code = "import sys, flows.registry; print('gto.api' in sys.modules)"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert r.stdout.strip() == "True", r.stdout + r.stderr
