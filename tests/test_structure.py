"""The layering read from the imports: no cycles, the client uses only public sidecar modules.

Every ``import`` counts, at module level, inside functions and under ``TYPE_CHECKING``:
a cycle hidden in a function is still one module that cannot be read without the other.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Callable
from pathlib import Path

from harness import REPO

PACKAGES = ("indextts_client", "indextts_sidecar")


def _statements() -> dict[str, set[tuple[str, str]]]:
    """Module -> each of its imports as (the module named, the name imported from it; "" for ``import x``)."""
    statements: dict[str, set[tuple[str, str]]] = {}
    for package in PACKAGES:
        for path in sorted((Path(REPO) / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            base = parts if is_package else parts[:-1]
            found: set[tuple[str, str]] = set()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    if node.level:
                        target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
                    else:
                        target = node.module or ""
                    found.update((target, alias.name) for alias in node.names)
                elif isinstance(node, ast.Import):
                    found.update((alias.name, "") for alias in node.names)
            statements[".".join(parts)] = found
    return statements


def _imports() -> dict[str, set[str]]:
    """Module -> the modules of our two packages it imports (names as written, resolved)."""
    graph: dict[str, set[str]] = {}
    for module, statements in _statements().items():
        found = {target for target, _ in statements} | {f"{target}.{name}" for target, name in statements if name}
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


def test_no_module_takes_a_private_name_from_another() -> None:
    # A leading underscore means "this module's own": a name another module needs is made
    # public in its module (its __all__), so that what a module offers is what it says.
    statements = _statements()
    taken = {
        f"{module} imports {target}.{name}"
        for module, imports in statements.items()
        for target, name in imports
        if name.startswith("_")
        and not name.startswith("__")
        and target.split(".")[0] in PACKAGES
        and f"{target}.{name}" not in statements  # a private module is imported as a module: fine
    }
    assert taken == set()


# ------------------------------------------------------------------ each layer's allowed imports
#
# The client's layers, bottom up (docs/architecture.md): the wire (one protocol connection over
# any streams), requests, supervision (a sidecar's lifetimes), the facades, and what serves them.
# A layer is a set of name patterns (below ``indextts_client.``), so that a module split out later
# (``_deadlines``, ``_transports``...) or moved into its layer's folder (``_wire/``,
# ``_supervision/``) falls under its layer's rule the day it lands.

WIRE = ("_connection", "_exchange", "_sender", "_handshake", "_deadline*", "_wire", "_wire.*")
SUPERVISION = (
    "_supervisor",
    "_supervision",
    "_supervision.*",
    "_transport*",
    "_restart*",
    "_settings*",
    "_process",
    "_detached",
    "_mps",
)
FACADES = ("_client", "_pool", "_pool_cli", "_pool_routing", "_pool_stream", "_blocking", "_signature", "_stream_text")
SERVING = ("http", "http.*", "ray", "ray.*", "wyoming", "wyoming.*")
#: The speech-service core under the serving front ends (docs/architecture.md).
SERVICE = ("_service", "_service.*")
TOOLS = ("_cli", "_doctor", "_engines", "__main__")
#: Where the public names are defined: values every layer shares.
SHARED = ("_audio", "_types", "_exceptions", "_defaults", "_socket_events")


def _in(module: str, layer: tuple[str, ...]) -> bool:
    prefix = "indextts_client."
    return module.startswith(prefix) and any(fnmatch.fnmatchcase(module[len(prefix) :], p) for p in layer)


def _dependencies(statements: dict[str, set[tuple[str, str]]]) -> dict[str, set[tuple[str, str]]]:
    """Module -> (a module of our packages it depends on, the name it takes from it; "" for all of it).

    ``from package import module`` depends on that module, not on the package's ``__init__``.
    """
    deps: dict[str, set[tuple[str, str]]] = {}
    for module, imports in statements.items():
        found = set()
        for target, name in imports:
            if name and f"{target}.{name}" in statements:
                target, name = f"{target}.{name}", ""
            if target.split(".")[0] in PACKAGES and target != module:
                found.add((target, name))
        deps[module] = found
    return deps


def _breaches(
    statements: dict[str, set[tuple[str, str]]], layer: tuple[str, ...], allowed: Callable[[str, str, str], bool]
) -> set[str]:
    """``module imports target[.name]`` for each import of a module of ``layer`` that ``allowed`` refuses."""
    return {
        f"{module} imports {target}{'.' + name if name else ''}"
        for module, deps in _dependencies(statements).items()
        if _in(module, layer)
        for target, name in deps
        if not allowed(module, target, name)
    }


def _public_names() -> set[str]:
    import indextts_client

    return set(indextts_client.__all__)


def test_each_layer_pattern_names_modules_that_exist() -> None:
    modules = set(_statements())
    for layer in (WIRE, SUPERVISION, FACADES, SERVING, SERVICE, TOOLS, SHARED):
        assert any(_in(module, layer) for module in modules), layer


def test_the_wire_imports_neither_supervision_nor_the_facades() -> None:
    above = SUPERVISION + FACADES + SERVING + SERVICE + TOOLS
    assert _breaches(_statements(), WIRE, lambda _m, target, _n: not _in(target, above)) == set()


def test_supervision_imports_no_facade() -> None:
    above = FACADES + SERVING + SERVICE + TOOLS
    assert _breaches(_statements(), SUPERVISION, lambda _m, target, _n: not _in(target, above)) == set()


def _serving_may_import(module: str, target: str, name: str) -> bool:
    """http/, ray and wyoming: the facades, the shared values, public modules and public names only."""
    if not target.startswith("indextts_client"):
        return True  # the sidecar's modules: test_the_client_imports_only_the_public_sidecar_modules
    own = module.split(".")[:2]
    if target.split(".")[:2] == own:
        return True  # within its own package (http/'s modules)
    private = any(part.startswith("_") for part in target.split(".")[1:])
    return not private or _in(target, FACADES + SHARED + SERVICE) or name in _public_names()


def test_the_serving_adapters_import_only_public_names_or_the_facades() -> None:
    assert _breaches(_statements(), SERVING, _serving_may_import) == set()


def _service_may_import(module: str, target: str, name: str) -> bool:
    """The service core: the facades, the shared values and the sidecar's public modules; never
    a front end (http/, wyoming, ray) nor a web or Wyoming library."""
    top = target.split(".")[0]
    if top in ("starlette", "uvicorn", "wyoming", "prometheus_client", "h11", "websockets"):
        return False
    if top != "indextts_client":
        return True
    return _in(target, FACADES + SHARED + SERVICE) or (target == "indextts_client" and name in _public_names())


def _service_statements() -> set[str]:
    """Every import of the service core, third-party ones included."""
    return {
        f"{module} imports {target}{'.' + name if name else ''}"
        for module, imports in _statements().items()
        if _in(module, SERVICE)
        for target, name in imports
        if not _service_may_import(module, target, name)
    }


def test_the_service_core_imports_no_front_end_and_no_web_library() -> None:
    assert _service_statements() == set()


def test_the_front_ends_import_each_other_never() -> None:
    def allowed(module: str, target: str, _name: str) -> bool:
        return not (_in(target, SERVING) and target.split(".")[:2] != module.split(".")[:2])

    breaches = _breaches(_statements(), ("http", "http.*", "wyoming"), allowed)
    assert {b for b in breaches if "indextts_client.ray" not in b} == set()


def _protocol_may_import(module: str, target: str, name: str) -> bool:
    return not target.startswith("indextts_sidecar") or target.split(".")[:2] == ["indextts_sidecar", "protocol"]


def test_the_protocol_package_imports_nothing_of_the_sidecar_outside_it() -> None:
    protocol = ("indextts_sidecar.protocol", "indextts_sidecar.protocol.*")
    breaches = {
        f"{module} imports {target}{'.' + name if name else ''}"
        for module, deps in _dependencies(_statements()).items()
        if any(fnmatch.fnmatchcase(module, p) for p in protocol)
        for target, name in deps
        if not _protocol_may_import(module, target, name)
    }
    assert breaches == set()


def test_a_layer_breach_is_found_when_there_is_one() -> None:
    statements = {
        "indextts_client._connection": {("indextts_client._client", "Client"), ("indextts_client._audio", "Audio")},
        "indextts_client._deadlines": {("indextts_client._transports", "SpawnTransport")},
        "indextts_client._client": set(),
        "indextts_client._transports": set(),
        "indextts_client._audio": set(),
        "indextts_client.ray": {("indextts_client._request", "_resolve"), ("indextts_client._request", "Synthesis")},
        "indextts_client._request": set(),
    }
    above = SUPERVISION + FACADES + SERVING + TOOLS
    assert _breaches(statements, WIRE, lambda _m, target, _n: not _in(target, above)) == {
        "indextts_client._connection imports indextts_client._client.Client",
        "indextts_client._deadlines imports indextts_client._transports.SpawnTransport",
    }
    assert _breaches(statements, SERVING, _serving_may_import) == {
        "indextts_client.ray imports indextts_client._request._resolve"
    }


# ------------------------------------------------------------------ sizes and private reach

#: A module one reader can hold: past this, split it by role (docs/architecture.md).
MAX_MODULE_LINES = 600
#: ``other._name`` (an attribute starting with one underscore, on anything but self, cls or
#: super()): each is a seam one object reaches through; a handful are deliberate and named below.
MAX_PRIVATE_REACHES = 8
#: Standard-library functions whose documented public name starts with an underscore.
PUBLIC_UNDERSCORE_NAMES = {"os._exit"}


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (Path(REPO) / package).rglob("*.py"))


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(REPO)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def _private_reaches(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        if ast.unparse(node) in PUBLIC_UNDERSCORE_NAMES:
            continue
        found.append(ast.unparse(node))
    return found


def test_few_uses_of_another_objects_private_names() -> None:
    reaches = [f"{p.relative_to(REPO)}: {r}" for p in _modules() for r in _private_reaches(p.read_text())]
    assert len(reaches) <= MAX_PRIVATE_REACHES, "\n".join(reaches)


def test_a_private_reach_is_found_when_there_is_one() -> None:
    assert _private_reaches("def f(pool):\n    self._x = pool._acquire()\n    super()._y()\n    os._exit(1)\n") == [
        "pool._acquire"
    ]


def test_test_files_have_unique_names() -> None:
    # pytest's rootdir import mode (no __init__.py) imports a test file by its basename: two
    # files of one name stop the whole collection with "import file mismatch".
    names = [path.name for path in (Path(REPO) / "tests").rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


#: The longest function the sidecar's modules may hold (the IndexTTS adapter's folder has its own owner).
MAX_SIDECAR_FUNCTION_LINES = 80


def _long_functions(source: str, limit: int) -> list[str]:
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_sidecar_function_is_over_80_lines() -> None:
    # A synthesis, lone or batched, writes through one Sink (_jobs.py): what a request sends is
    # said once, and execute_batch is a loop over the engine's steps, not a second copy.
    sidecar = Path(REPO) / "indextts_sidecar"
    long = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted(sidecar.rglob("*.py"))
        if (sidecar / "engines" / "indextts") not in path.parents
        for name in _long_functions(path.read_text(encoding="utf-8"), MAX_SIDECAR_FUNCTION_LINES)
    ]
    assert long == []


def test_a_long_function_is_found_when_there_is_one() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(3))
    assert _long_functions(f"def f():\n{body}", 3) == ["f (4 lines)"]
    assert _long_functions(f"def f():\n{body}", 4) == []
