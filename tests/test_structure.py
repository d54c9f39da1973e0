"""The tree shows the pipeline: the stages and other command lines at the top of transformer/,
the library in subpackages importing one way (core <- data <- model <- training), no cycles,
no module past 400 lines, and the benchmarks grouped."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "transformer"
# the library's subpackages, lowest first: each may import only those before it
ORDER = ("core", "data", "model", "training")
ENTRY = {"download", "parent", "helpers", "score", "backtranslate", "distill", "tokenizer"}
ENTRY |= {"shard", "train", "average", "evaluate", "race", "package", "decode", "export"}
ENTRY |= {"config", "launch"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """The project modules `path` imports, anywhere in it (function-level imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.split(".")[0] in ("transformer", "flows")}


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def layer(module: str) -> str:
    """'top' for transformer/*.py, else the subpackage's name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ORDER) else "top"


def test_the_top_level_holds_only_the_entry_points() -> None:
    top = {p.stem for p in PKG.glob("*.py")} - {"__init__"}
    assert top == ENTRY
    assert len(list(PKG.glob("*.py"))) <= 18


@pytest.mark.parametrize("sub", ORDER)
def test_each_subpackage_says_what_it_holds(sub: str) -> None:
    doc = ast.get_docstring(ast.parse((PKG / sub / "__init__.py").read_text()))
    assert doc and "Promise" in doc, f"transformer/{sub}/__init__.py: no docstring with a promise"
    modules = [p for p in (PKG / sub).glob("*.py") if p.name != "__init__.py"]
    # a dozen or so: training's are the loop (loop.py) and the twelve parts it hands work to
    assert 0 < len(modules) <= 13, f"transformer/{sub}: {len(modules)} modules"


def test_the_library_imports_one_way() -> None:
    """A library module imports only its own subpackage and those below it, never a stage or
    another command line at the top (an edit to beam search must not rerun training)."""
    wrong = []
    for name, path in MODULES.items():
        mine = layer(name)
        if mine == "top":
            continue
        allowed = set(ORDER[: ORDER.index(mine) + 1])
        for imp in imports(path):
            if imp == "transformer" or imp not in MODULES:
                continue  # `from transformer.core import x` also yields transformer.core.x
            if layer(imp) == "top" or layer(imp) not in allowed:
                wrong.append(f"{name} imports {imp}")
    assert not wrong, "\n".join(wrong)


def test_there_are_no_import_cycles() -> None:
    graph = {
        name: {imp for imp in imports(path) if imp in MODULES and imp != name}
        for name, path in MODULES.items()
    }
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt] if nxt in stack else [node, nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_no_module_is_past_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in [*PKG.rglob("*.py"), *(ROOT / "flows").glob("*.py")]
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long


def test_the_package_layout_is_named_only_in_core_layout() -> None:
    """No module joins a path with a package file's name but through transformer/core/layout.py
    (params.yaml aside: the project's own file, settings.PARAMS, has the same name)."""
    from transformer.core import layout

    names = {layout.MODEL, layout.TOKENIZER, layout.LINEAGE, layout.CARD, layout.EVAL}
    names |= {layout.HF, layout.CT2}
    spelled = [
        f"{p.relative_to(ROOT)}:{node.lineno} / {node.right.value!r}"
        for p in [*PKG.rglob("*.py"), *(ROOT / "flows").glob("*.py")]
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and isinstance(node.right, ast.Constant)
        and node.right.value in names
    ]
    assert not spelled


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests/helpers/ or conftest.py: a test module imports no other, so
    each runs alone and collecting one never runs another's tests' module code."""
    tests = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[-1] in tests and parts[:-1] in ([], ["tests"]):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not found, "\n".join(found)


def test_the_benchmarks_are_grouped() -> None:
    assert len(list((ROOT / "benchmarks").glob("*.py"))) <= 10
