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


ORCHESTRATION = "## Orchestration (Prefect)"


def readme_orchestration() -> list[list[str]]:
    """The commands of the README's orchestration block, one argv each (comments dropped, a
    line's `A && B` two commands)."""
    text = (ROOT / "README.md").read_text()
    assert ORCHESTRATION in text, f"README.md: no section {ORCHESTRATION!r}"
    block = text.split(ORCHESTRATION, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    out: list[list[str]] = []
    for line in block.splitlines():
        argv = shlex.split(line, comments=True)
        while "&&" in argv:
            i = argv.index("&&")
            out.append(argv[:i])
            argv = argv[i + 1 :]
        if argv:
            out.append(argv)
    return out


def shipped_lines(dvc_yaml: str) -> str:
    """`dvc_yaml` (a project's text) with the shipped dvc.yaml's `artifacts:` section, its lines
    as they are, in place of its own."""
    shipped = (ROOT / "dvc.yaml").read_text().split("\nartifacts:\n", 1)[1]
    return dvc_yaml.split("\nartifacts:", 1)[0] + "\nartifacts:\n" + shipped
