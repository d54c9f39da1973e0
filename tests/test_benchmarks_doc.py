"""docs/benchmarks.md's table of scripts and benchmarks/ itself: one to one, so that no script
lies there unmaintained and no documented one is gone."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_file_in_benchmarks_is_in_the_table_and_nothing_else():
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    section = doc.split("## The scripts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = [name for row in rows for name in re.findall(r"`([\w.]+)`", row.split("|")[1])]
    files = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.name != "__pycache__")
    assert sorted(documented) == files
    for row in rows:  # each script run by a command that names it, with its figure
        cells = [c.strip() for c in row.strip("|").split("|")]
        scripts = re.findall(r"`([\w.]+)\.py`", cells[0])
        runs = any(f"benchmarks.{n}" in cells[1] for n in scripts)
        helper = cells[1].startswith("(")  # loaded by another script, not run itself
        assert runs or helper, f"no command runs {cells[0]}"
        assert helper or cells[2] not in ("", "—"), f"{cells[0]}: no current figure"


def test_every_name_the_benchmarks_import_from_the_project_exists():
    """The benchmarks import most of the project's names inside functions, where importing the
    module proves nothing: each `from transformer... import NAME` / `from flows... import NAME`
    (a module's top or a function's body) must name something that is there."""
    import ast
    import importlib.util

    missing = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                "transformer",
                "flows",
                "benchmarks",
            ):
                module = importlib.import_module(node.module)
                missing += [
                    f"{path.name}:{node.lineno}: {node.module}.{a.name}"
                    for a in node.names
                    if not hasattr(module, a.name)
                    and importlib.util.find_spec(f"{node.module}.{a.name}") is None
                ]
    assert not missing, missing
