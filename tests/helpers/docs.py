"""The docs' own commands, read from the files a user reads: run by the tests as written."""

from __future__ import annotations

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs/orchestration.md"
STEPS = "## A first run, step by step"


def walkthrough() -> list[list[str]]:
    """The commands of the doc's walkthrough block, one argv each (comments dropped)."""
    text = DOC.read_text()
    assert STEPS in text, f"{DOC}: no section {STEPS!r}"
    block = text.split(STEPS, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [argv for line in block.splitlines() if (argv := shlex.split(line, comments=True))]


def readme_fetch() -> list[str]:
    """The README's command that fetches the champion."""
    (line,) = [
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("dvc artifacts get")
    ]
    return shlex.split(line, comments=True)
