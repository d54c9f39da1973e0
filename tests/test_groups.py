"""`make test` runs two pytest-xdist workers with --dist loadgroup: the tests in one
xdist_group must share a worker, or each worker builds the group's fixture (a trained champion,
a served project) itself. pytest 9.2 broke that silently (pytest-xdist#1386); this catches it."""

from __future__ import annotations

import subprocess
import sys

import pytest

CONFTEST = """
import os, pytest

@pytest.fixture(scope="session")
def built():
    with open("built.log", "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""

TESTS = """
import time, pytest

@pytest.mark.xdist_group("shared")
def test_grouped(built):
    time.sleep(0.3)

@pytest.mark.parametrize("i", range(4))
def test_free(i):
    time.sleep(0.3)
"""


@pytest.mark.slow  # three pytest processes (~12 s): `make test`'s two-worker mode, tested there
def test_an_xdist_group_runs_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name in ("a", "b", "c"):
        (tmp_path / f"test_{name}.py").write_text(TESTS)
    run = subprocess.run(  # noqa: PLW1510 (its returncode is asserted with its output)
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
        + ["--dist", "loadgroup", "--no-loadscope-reorder"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "15 passed" in run.stdout, run.stdout
    # three grouped tests in three files: one worker ran them all, so built it once
    assert len((tmp_path / "built.log").read_text().split()) == 1
