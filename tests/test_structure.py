"""The layering read from the imports: no cycles, the client uses only public sidecar modules.

Every ``import`` counts, at module level, inside functions and under ``TYPE_CHECKING``:
a cycle hidden in a function is still one module that cannot be read without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

from harness import REPO

PACKAGES = ("indextts_client", "indextts_sidecar")


def _imports() -> dict[str, set[str]]:
    """Module -> the modules of our two packages it imports (names as written, resolved)."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((Path(REPO) / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            module = ".".join(parts)
            base = parts if is_package else parts[:-1]
            found: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    if node.level:
                        target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
                    else:
                        target = node.module or ""
                    found.add(target)
                    found.update(f"{target}.{alias.name}" for alias in node.names)
                elif isinstance(node, ast.Import):
                    found.update(alias.name for alias in node.names)
            graph[module] = {name for name in found if name.split(".")[0] in PACKAGES and name != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    edges = {module: {name for name in names if name in graph} for module, names in graph.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return cycles


def test_the_packages_have_no_import_cycles() -> None:
    graph = _imports()
    assert "indextts_client._request" in graph and "indextts_sidecar._server" in graph
    assert _cycles(graph) == []


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_client_imports_only_the_public_sidecar_modules() -> None:
    private = {
        f"{module} imports {name}"
        for module, names in _imports().items()
        if module.startswith("indextts_client")
        for name in names
        if name.startswith("indextts_sidecar")
        and any(part.startswith("_") and not part.endswith("__") for part in name.split(".")[1:])
    }
    assert private == set()
