"""docs/benchmarks.md's tables of scripts and benchmarks/ itself: one to one, so that no script
lies there unmaintained and no documented one is gone; one table per group (subpackage)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def test_every_file_in_benchmarks_is_in_the_table_and_nothing_else():
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    section = doc.split("## The scripts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = [name for row in rows for name in re.findall(r"`([\w./]+)`", row.split("|")[1])]
    files = sorted(
        str(p.relative_to(BENCH))
        for p in BENCH.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert sorted(documented) == files
    for row in rows:  # each script run by a command that names it, with its figure
        cells = [c.strip() for c in row.strip("|").split("|")]
        scripts = re.findall(r"`([\w/]+)\.py`", cells[0])
        runs = any(f"benchmarks.{n.replace('/', '.')}" in cells[1] for n in scripts)
        helper = cells[1].startswith("(")  # loaded by another script, not run itself
        assert runs or helper, f"no command runs {cells[0]}"
        assert helper or cells[2] not in ("", "—"), f"{cells[0]}: no current figure"


def test_the_tables_follow_the_groups():
    """A table per subpackage, under a heading that names it, listing that subpackage's files
    only; the package's own files (benchmarks/*.py) in the first table."""
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    section = doc.split("## The scripts", 1)[1].split("\n## ", 1)[0]
    tables = section.split("\n### ")[1:]
    groups = sorted(p.name for p in BENCH.iterdir() if (p / "__init__.py").is_file())
    headed = [re.match(r"`(\w+)/`", t) for t in tables]
    assert sorted(m.group(1) for m in headed if m) == groups
    for table, m in zip(tables, headed):
        rows = [line for line in table.splitlines() if line.startswith("| `")]
        names = [n for row in rows for n in re.findall(r"`([\w./]+)`", row.split("|")[1])]
        assert names, table.splitlines()[0]
        if m:
            assert all(n.startswith(f"{m.group(1)}/") for n in names), names
        else:
            assert all("/" not in n for n in names), names


def test_every_name_the_benchmarks_import_from_the_project_exists():
    """The benchmarks import most of the project's names inside functions, where importing the
    module proves nothing: each `from transformer... import NAME` / `from flows... import NAME`
    (a module's top or a function's body) must name something that is there."""
    import ast
    import importlib.util

    missing = []
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                "transformer",
                "flows",
                "benchmarks",
            ):
                module = importlib.import_module(node.module)
                missing += [
                    f"{path.relative_to(BENCH)}:{node.lineno}: {node.module}.{a.name}"
                    for a in node.names
                    if not hasattr(module, a.name)
                    and importlib.util.find_spec(f"{node.module}.{a.name}") is None
                ]
    assert not missing, missing
