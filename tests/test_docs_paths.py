"""The README, the docs, dvc.yaml and the code's own texts (docstrings, comments, --help) name
only module paths that exist: `transformer/x/y.py`, `python -m transformer.x`, `benchmarks.x.y`,
`flows.x`. The dated experiment logs and the changelog keep the paths of their day."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("transformer", "flows", "benchmarks")
FILE = re.compile(r"(?<![\w./-])((?:transformer|flows|benchmarks|tests)(?:/[a-z_][\w-]*)+\.py)\b")
DOTTED = re.compile(r"(?<![\w./-])((?:transformer|flows|benchmarks)(?:\.[a-z_][a-z0-9_]*)+)")


def texts() -> list[Path]:
    docs = [ROOT / "README.md", ROOT / "dvc.yaml", ROOT / "Makefile", ROOT / "data/README.md"]
    docs += sorted((ROOT / "docs").glob("*.md"))
    code = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return [p for p in docs + code if p.is_file()]


def exists_dotted(dotted: str) -> bool:
    """A module, a package, or a name inside one (transformer.core.settings.load)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return n == len(parts) or n >= 2  # a name inside a module or package
    return False


@pytest.mark.parametrize("path", texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_path_named_exists(path: Path) -> None:
    missing = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in FILE.finditer(line):
            if not (ROOT / m.group(1)).is_file():
                missing.append(f"line {n}: {m.group(1)}")
        for m in DOTTED.finditer(line):
            dotted = m.group(1).rstrip(".")
            if dotted.endswith((".py", ".md", ".yaml", ".lock", ".json")) or dotted.count(".") == 0:
                continue
            if not exists_dotted(dotted):
                missing.append(f"line {n}: {dotted}")
    assert not missing, f"{path.relative_to(ROOT)} names paths that do not exist:\n" + "\n".join(
        missing
    )
