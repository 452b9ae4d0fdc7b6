"""The layering read from the imports: no cycles, the client uses only public sidecar modules.

Every ``import`` counts, at module level, inside functions and under ``TYPE_CHECKING``:
a cycle hidden in a function is still one module that cannot be read without the other.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Union

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
    assert "indextts_client._wire._request" in graph and "indextts_sidecar._server" in graph
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
# The client's layers, bottom up (docs/architecture.md): shared values, text, requests, the wire
# (one protocol connection over any streams), supervision (a sidecar's lifetimes), the facades
# (Client and what wraps it, the pool among them), the service core, what serves it, the
# integrations and the tools.  Every client module stands in exactly one
# (test_each_client_module_stands_in_one_layer).
# A layer is a set of name patterns (below ``indextts_client.``), so that a module split out later
# falls under its layer's rule the day it lands.  The folders show the layers: ``_wire/`` holds
# the wire and the requests on it, ``_supervision/`` supervision, ``_pool/`` the pool; the root
# holds the shared values, the sentence splitter, the one-sidecar facades and the tools
# (FOLDERS, further down, says which folder may import which).

WIRE = ("_wire", "_wire._connection", "_wire._exchange", "_wire._sender", "_wire._handshake", "_wire._deadline*")
#: What a caller holds: the request methods and a request's run (an SSML request's too).  They
#: stand on the request seam alone (``_exchange``'s Channel); ``Connection`` is a Requester.
REQUESTS = ("_wire._request", "_wire._request_run", "_ssml._run")
#: Text in, text out: the sentence splitter and the SSML reader, planner and cutter (no I/O).
TEXT = ("_sentences", "_ssml", "_ssml._parse", "_ssml._plan", "_ssml._numbers", "_ssml._render", "_ssml._cut")
SUPERVISION = ("_supervision", "_supervision.*")
#: Several sidecars: a facade over Clients (test_no_one_sidecar_module_imports_the_pool).
POOL = ("_pool", "_pool.*")
FACADES = ("_client", "_blocking", "_loop_thread", "_signature", "_stream_text", *POOL)
SERVING = ("http", "http.*", "ray", "ray.*", "wyoming", "wyoming.*")
#: The speech-service core under the serving front ends (docs/architecture.md).
SERVICE = ("_service", "_service.*")
#: Agent frameworks' services: public names only, like any application.
INTEGRATIONS = ("integrations", "integrations.*")
#: ``indextts-client setup`` and ``envs``: the registry's writer, which the CLI gives ``Client``.
SETUP = ("_setup", "_setup.*")
#: The top floor: command-line verbs (the CLI runs a Client, setup and the doctor).
TOOLS = ("_cli", "_doctor", "_engines", "__main__", *SETUP)
#: Where the public names are defined: values every layer shares; and the registry of engine
#: environments, which Client asks and setup writes (standard library and msgspec only).
SHARED = ("_audio", "_types", "_exceptions", "_defaults", "_socket_events", "_registry")
LAYERS = {
    "wire": WIRE,
    "requests": REQUESTS,
    "text": TEXT,
    "supervision": SUPERVISION,
    "facades": FACADES,
    "service": SERVICE,
    "serving": SERVING,
    "integrations": INTEGRATIONS,
    "tools": TOOLS,
    "shared": SHARED,
}
BELOW_TOOLS = tuple(pattern for name, layer in LAYERS.items() if name != "tools" for pattern in layer)


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
    for name, layer in LAYERS.items():
        assert any(_in(module, layer) for module in modules), name


def test_each_client_module_stands_in_one_layer() -> None:
    # The package's __init__ is its public face, above every layer it re-exports.
    modules = sorted(m for m in _statements() if m.startswith("indextts_client."))
    placed = {m: [name for name, layer in LAYERS.items() if _in(m, layer)] for m in modules}
    assert {m: names for m, names in placed.items() if len(names) != 1} == {}


def test_the_wire_imports_neither_supervision_nor_the_facades() -> None:
    above = SUPERVISION + FACADES + SERVING + SERVICE + INTEGRATIONS + TOOLS
    assert _breaches(_statements(), WIRE, lambda _m, target, _n: not _in(target, above)) == set()


def _requests_may_import(_module: str, target: str, _name: str) -> bool:
    """The request layer: the request seam (``_exchange``), text, shared values, each other."""
    if not target.startswith("indextts_client"):
        return True
    return target == "indextts_client._wire._exchange" or _in(target, REQUESTS + TEXT + SHARED)


def test_a_request_uses_its_connection_only_through_the_request_seam() -> None:
    assert _breaches(_statements(), REQUESTS, _requests_may_import) == set()


def test_text_imports_only_text_and_shared_values() -> None:
    def allowed(_module: str, target: str, _name: str) -> bool:
        return not target.startswith("indextts_client") or _in(target, TEXT + SHARED)

    assert _breaches(_statements(), TEXT, allowed) == set()


def test_supervision_imports_no_facade() -> None:
    above = FACADES + SERVING + SERVICE + INTEGRATIONS + TOOLS
    assert _breaches(_statements(), SUPERVISION, lambda _m, target, _n: not _in(target, above)) == set()


def test_only_a_tool_imports_a_tool() -> None:
    # The CLI runs a Client; Client never reaches back into setup (the registry is a floor down).
    assert _breaches(_statements(), BELOW_TOOLS, lambda _m, target, _n: not _in(target, TOOLS)) == set()


def _setup_may_import(_module: str, target: str, _name: str) -> bool:
    """setup: its own modules, the shared values (the registry it writes) and the doctor it runs;
    no layer of the client: the CLI that runs setup hands it ``Client`` for its test synthesis."""
    if not target.startswith("indextts_client"):
        return True
    return _in(target, SETUP + SHARED) or target == "indextts_client._doctor"


def test_setup_imports_no_layer_of_the_client() -> None:
    assert _breaches(_statements(), SETUP, _setup_may_import) == set()


def test_no_one_sidecar_module_imports_the_pool() -> None:
    # A Pool is made of Clients: Client, its wire and its supervision know nothing of it.
    below = WIRE + REQUESTS + TEXT + SUPERVISION + ("_client", "_blocking", "_signature", "_stream_text") + SHARED
    assert _breaches(_statements(), below, lambda _m, target, _n: not _in(target, POOL)) == set()


#: The client's folders, each with the other folders its modules may import, bottom up (the
#: root's modules are held by the layer rules above).  ``_wire`` and ``_ssml`` meet in the request
#: layer: an SSML request's run (``_ssml._run``) stands on a request's run, and ``_request`` opens
#: one (lazily) when ``text_format="ssml"``.
FOLDERS: dict[str, tuple[str, ...]] = {
    "_wire": ("_ssml",),
    "_ssml": ("_wire",),
    "_supervision": ("_wire",),
    "_pool": ("_wire", "_supervision"),
    "_service": ("_pool",),
    "http": ("_service", "_pool"),
    "wyoming": ("_service", "_pool"),
    "ray": ("_service", "http"),
    "integrations": (),
    "_setup": (),
}


def _folder(module: str) -> Union[str, None]:
    """The client folder ``module`` stands in (``_wire`` for ``indextts_client._wire._connection``);
    None for a root module and for anything outside the client."""
    parts = module.split(".")
    if parts[0] != "indextts_client" or len(parts) < 2:
        return None
    return parts[1] if (Path(REPO) / "indextts_client" / parts[1]).is_dir() else None


def _folder_breaches(statements: dict[str, set[tuple[str, str]]]) -> set[str]:
    """``module imports target`` for each import from one client folder into another that FOLDERS refuses."""
    return {
        f"{module} imports {target}"
        for module, deps in _dependencies(statements).items()
        if (own := _folder(module)) is not None
        for target, _ in deps
        if (other := _folder(target)) not in (None, own) and other not in FOLDERS.get(own, ())
    }


def test_the_folder_table_names_every_client_folder() -> None:
    client = Path(REPO) / "indextts_client"
    assert sorted(p.name for p in client.iterdir() if (p / "__init__.py").is_file()) == sorted(FOLDERS)


def test_each_folder_imports_only_the_folders_it_stands_on() -> None:
    assert _folder_breaches(_statements()) == set()


def test_the_registry_imports_only_the_standard_library_and_msgspec() -> None:
    # Client imports it on every start: no third-party import but msgspec (platformdirs, lazily,
    # where the cli extra installed it), nothing of ours.
    imports = _statements()["indextts_client._registry"]
    tops = {target.split(".")[0] for target, _ in imports} - {"__future__", "msgspec", "platformdirs"}
    assert {top for top in tops if top not in sys.stdlib_module_names} == set()


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


def _integrations_may_import(module: str, target: str, name: str) -> bool:
    """integrations/: its own modules, public modules and public names, as an application would;
    and the WebSocket route's event structs (``_socket_events``, msgspec only), which the route
    writes and both services decode, so that the wire's events are defined once."""
    if not target.startswith("indextts_client") or target == "indextts_client._socket_events":
        return True  # the sidecar's modules: test_the_client_imports_only_the_public_sidecar_modules
    if target.split(".")[:2] == module.split(".")[:2]:
        return True
    if target == "indextts_client":
        return name in _public_names()
    return not any(part.startswith("_") for part in target.split(".")[1:])


def test_the_integrations_import_only_public_names() -> None:
    assert _breaches(_statements(), INTEGRATIONS, _integrations_may_import) == set()


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
        "indextts_client._wire._connection": {
            ("indextts_client._client", "Client"),
            ("indextts_client._audio", "Audio"),
        },
        "indextts_client._wire._deadlines": {("indextts_client._supervision._transports", "SpawnTransport")},
        "indextts_client._client": set(),
        "indextts_client._supervision._transports": set(),
        "indextts_client._audio": set(),
        "indextts_client.ray": {
            ("indextts_client._wire._request", "_resolve"),
            ("indextts_client._wire._request", "Synthesis"),
        },
        "indextts_client._wire._request": set(),
        "indextts_client._wire._request_run": {("indextts_client._wire._connection", "Connection")},
        "indextts_client._setup._command": {("indextts_client._client", "Client")},
        "indextts_client._registry": set(),
        "indextts_client.integrations.pipecat": {
            ("indextts_client._pool._pool", "Pool"),
            ("indextts_client", "Pool"),
            ("indextts_client.integrations._socket", "Timeline"),
        },
        "indextts_client.integrations._socket": set(),
        "indextts_client._pool._pool": set(),
    }
    statements["indextts_client._client"] = {("indextts_client._setup._command", "setup_command_main")}
    above = SUPERVISION + FACADES + SERVING + TOOLS
    assert _breaches(statements, WIRE, lambda _m, target, _n: not _in(target, above)) == {
        "indextts_client._wire._connection imports indextts_client._client.Client",
        "indextts_client._wire._deadlines imports indextts_client._supervision._transports.SpawnTransport",
    }
    assert _breaches(statements, SERVING, _serving_may_import) == {
        "indextts_client.ray imports indextts_client._wire._request._resolve"
    }
    assert _breaches(statements, REQUESTS, _requests_may_import) == {
        "indextts_client._wire._request_run imports indextts_client._wire._connection.Connection"
    }
    assert _breaches(statements, INTEGRATIONS, _integrations_may_import) == {
        "indextts_client.integrations.pipecat imports indextts_client._pool._pool.Pool"
    }
    assert _breaches(statements, BELOW_TOOLS, lambda _m, target, _n: not _in(target, TOOLS)) == {
        "indextts_client._client imports indextts_client._setup._command.setup_command_main"
    }
    assert _breaches(statements, SETUP, _setup_may_import) == {
        "indextts_client._setup._command imports indextts_client._client.Client"
    }
    statements["indextts_client._supervision._supervisor"] = {("indextts_client._pool._pool", "Pool")}
    assert _folder_breaches(statements) == {
        "indextts_client._supervision._supervisor imports indextts_client._pool._pool",
        "indextts_client._wire._deadlines imports indextts_client._supervision._transports",
        "indextts_client.ray imports indextts_client._wire._request",
        "indextts_client.integrations.pipecat imports indextts_client._pool._pool",
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


#: The longest function the sidecar's modules (the IndexTTS adapter's included) and the client's
#: may hold.
MAX_FUNCTION_LINES = 80


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
    # said once, and execute_batch is a loop over the engine's steps, not a second copy.  The
    # adapter's interceptors are methods of one class (_batched._Interceptors), not closures
    # inside one install() of 178 lines.
    sidecar = Path(REPO) / "indextts_sidecar"
    long = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted(sidecar.rglob("*.py"))
        for name in _long_functions(path.read_text(encoding="utf-8"), MAX_FUNCTION_LINES)
    ]
    assert long == []


def test_no_client_function_is_over_80_lines() -> None:
    client = Path(REPO) / "indextts_client"
    long = [
        f"{path.relative_to(REPO)}: {name.split(' ')[0]}"
        for path in sorted(client.rglob("*.py"))
        for name in _long_functions(path.read_text(encoding="utf-8"), MAX_FUNCTION_LINES)
    ]
    assert long == []


def test_a_long_function_is_found_when_there_is_one() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(3))
    assert _long_functions(f"def f():\n{body}", 3) == ["f (4 lines)"]
    assert _long_functions(f"def f():\n{body}", 4) == []


# ------------------------------------------------------------------ the drawing names every module


def _drawing() -> dict[str, list[tuple[str, str]]]:
    """docs/architecture.md's first drawing: package folder -> its entries as (name column, text).

    An entry is a line with a name in its first 30 columns and the lines below it that have none.
    """
    text = (Path(REPO) / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("```\n", 2)[1]
    sections: dict[str, list[tuple[str, str]]] = {}
    entries: list[tuple[str, str]] = []
    for line in block.splitlines():
        if line and not line[0].isspace():
            entries = sections.setdefault(line.split()[0], [])
            entries.append(("", line))
        elif line[:30].strip():
            entries.append((line[:30].strip(), line))
        elif entries:
            name, body = entries[-1]
            entries[-1] = (name, f"{body}\n{line}")
    return sections


def _unnamed(modules: list[str], sections: dict[str, list[tuple[str, str]]]) -> list[str]:
    """The modules (``package/folder/module.py``) the drawing does not name.

    One at the root of its section is named as ``module.py``; one in a folder by its stem, in the
    entry of its innermost folder (``_service/``: backend, facts...).
    """
    missing = []
    for module in modules:
        section = max((s for s in sections if module.startswith(s)), key=len, default=None)
        if section is None:
            missing.append(module)
            continue
        *folders, name = module[len(section) :].split("/")
        stem = name.removesuffix(".py")
        if not folders:
            texts = [body for _, body in sections[section]]
            pattern = rf"(?<![\w.]){re.escape(name)}\b"
        else:
            texts = [body for entry, body in sections[section] if entry.startswith(f"{folders[-1]}/")]
            pattern = rf"(?<![\w.]){re.escape(stem)}(\.py)?\b"
        if not any(re.search(pattern, body) for body in texts):
            missing.append(module)
    return missing


def test_the_drawing_names_every_module() -> None:
    # docs/architecture.md draws each package's modules: a module that lands without a line there
    # is a room missing from the plan.  __init__ and __main__ are the folder's own.
    modules = [str(path.relative_to(REPO)) for path in _modules() if path.name not in ("__init__.py", "__main__.py")]
    assert _unnamed(modules, _drawing()) == []


def test_an_unnamed_module_is_found_when_there_is_one() -> None:
    sections = {
        "pkg/": [("", "pkg/   the package"), ("_a.py, _b.py", "  _a.py, _b.py   two"), ("sub/", "  sub/   _c (one)")]
    }
    modules = ["pkg/_a.py", "pkg/_b.py", "pkg/_ab.py", "pkg/sub/_c.py", "pkg/sub/_d.py", "pkg/_c.py", "other/x.py"]
    assert _unnamed(modules, sections) == ["pkg/_ab.py", "pkg/sub/_d.py", "pkg/_c.py", "other/x.py"]


def test_every_bench_helper_is_named_in_the_docs() -> None:
    docs = "\n".join(p.read_text(encoding="utf-8") for p in (Path(REPO) / "docs").glob("*.md"))
    helpers = sorted(p.name for p in (Path(REPO) / "bench").glob("_*.py"))
    assert [name for name in helpers if name not in docs] == []


def _docstring_gaps(doc: str, modules: list[str]) -> list[str]:
    """The modules a package docstring leaves out, when it lists them (names half or more)."""
    named = [m for m in modules if re.search(rf"(?<!\w){re.escape(m)}\b", doc)]
    return [m for m in modules if m not in named] if 2 * len(named) >= len(modules) else []


def test_a_package_docstring_that_lists_its_modules_lists_them_all() -> None:
    gaps = {}
    for init in sorted(p for p in _modules() if p.name == "__init__.py"):
        folder = init.parent
        modules = sorted(p.stem for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
        modules += sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
        if missing := _docstring_gaps(ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or "", modules):
            gaps[str(init.relative_to(REPO))] = missing
    assert gaps == {}


def test_a_docstring_gap_is_found_when_there_is_one() -> None:
    assert _docstring_gaps("``_a``, :mod:`.b` and ``_ab``", ["_a", "b", "_c"]) == ["_c"]
    assert _docstring_gaps("``_a`` only", ["_a", "b", "_c"]) == []  # not a listing
