"""What a module imports: the project files a DVC stage running it depends on."""

from pathlib import Path


def imported_modules(root: Path, module: str) -> set[str]:
    """The project's module files (transformer/..., flows/...) that `module` (dotted) imports,
    transitively, itself included; imports inside functions count too: they run with it, and so
    does each package's __init__.py above an imported module."""
    import ast

    def paths(dotted: str) -> list[str]:
        parts = dotted.split(".")
        inits = [
            "/".join(parts[:i]) + "/__init__.py"
            for i in range(1, len(parts) + 1)
            if (root / "/".join(parts[:i]) / "__init__.py").is_file()
        ]
        rel = dotted.replace(".", "/") + ".py"
        return inits + [rel] if (root / rel).is_file() else inits

    seen: set[str] = set()
    todo = [module]
    while todo:
        for rel in paths(todo.pop()):
            if rel in seen:
                continue
            seen.add(rel)
            for node in ast.walk(ast.parse((root / rel).read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    # `from pkg import mod` names a module; `from pkg.mod import name` does not
                    todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    todo += [a.name for a in node.names]
    return seen
