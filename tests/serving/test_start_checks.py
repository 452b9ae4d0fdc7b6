"""Start only what can speak: ``serve``, ``wyoming`` and ``Pool.start()`` load the engine before
they say they are ready, and an engine that cannot load ends the start-up with exit 1 and one
line that names the extra to install.

They run in real venvs holding exactly what the documented installs bring, none of them
``[espeak]``: ``pip install ".[server]"``, ``".[server,cli]"`` and ``".[wyoming,cli]"``
(tests/upstream/build_venv.py's ``extras-*`` flavours: the core and those extras' requirements as
pyproject.toml lists them, cached under ``$INDEXTTS_SIDECAR_CACHE``/``~/.cache/indextts-sidecar``),
with the checkout under test on ``PYTHONPATH`` in place of the installed project.  The first run
builds them (pip installs; PyPI or pip's cache); a venv that cannot be built fails the test with
the builder's message.  Each command is the one a user of that install types: ``.[server]``
alone starts the server as ``python -m indextts_client.http`` (docs/serving.md) as well as
through the ``indextts-client`` script's module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
from pathlib import Path
from types import ModuleType

import anyio
import pytest
from harness import REPO

from indextts_client import Pool, StartError

#: Each documented install and its venv's flavour in tests/upstream/build_venv.py.
INSTALLS = {".[server]": "extras-server", ".[server,cli]": "extras-server-cli", ".[wyoming,cli]": "extras-wyoming-cli"}
#: A top-level module of each extra, to check that a venv holds what its install brings and no more.
PROBES = {"espeak": "espeakng_loader", "server": "starlette", "cli": "rich", "wyoming": "wyoming", "test": "httpx"}
PRESENT = {".[server]": {"server"}, ".[server,cli]": {"server", "cli"}, ".[wyoming,cli]": {"wyoming", "cli"}}
TIMEOUT = 60

Pythons = dict[str, str]


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_venv", Path(REPO) / "tests" / "upstream" / "build_venv.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pythons() -> Pythons:
    """Each install's venv python, built on first use (then reused from the cache)."""
    builder = _builder()
    out: Pythons = {}
    for install, flavour in INSTALLS.items():
        try:
            python = builder.find_interpreter(flavour)
        except SystemExit as unsuitable:
            pytest.skip(f"no interpreter for the {install} venv: {unsuitable}")
        failure = None
        try:
            out[install] = str(builder.build(flavour, python))
        except (SystemExit, subprocess.CalledProcessError) as failed:  # its output is on stderr above
            failure = f"could not build the {install} venv ({flavour}): {failed}"
        if failure is not None:
            pytest.fail(failure, pytrace=False)
    return out


def _environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = REPO  # the checkout under test, as build_venv.py's venvs expect
    return env


def _run(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, *args], capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL, env=_environment()
    )


def _refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("install", list(INSTALLS))
def test_each_venv_holds_what_its_install_brings(pythons: Pythons, install: str) -> None:
    code = (
        "import importlib.util as u, json, sys, indextts_client as c\n"
        "print(json.dumps([c.__file__, {m: u.find_spec(m) is not None for m in sys.argv[1:]}]))"
    )
    done = _run(pythons[install], "-c", code, *PROBES.values())
    assert done.returncode == 0, done.stderr
    where, found = json.loads(done.stdout)
    assert where.startswith(os.path.join(REPO, "indextts_client")), where  # the checkout, not an installed copy
    assert found == {module: extra in PRESENT[install] for extra, module in PROBES.items()}, install


@pytest.mark.parametrize(
    ("install", "command"),
    [
        (".[server]", ["-m", "indextts_client.http"]),
        (".[server]", ["-m", "indextts_client", "serve"]),
        (".[server,cli]", ["-m", "indextts_client", "serve"]),
    ],
)
def test_serve_without_espeak_exits_1_naming_the_extra(pythons: Pythons, install: str, command: list[str]) -> None:
    done = _run(pythons[install], *command, "--engine", "espeak", "--port", "0")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    # The line that says where it listened, then the one that says why it stopped: nothing else.
    assert len(lines) == 2, done.stderr
    listening = re.search(r"listening on http://127\.0\.0\.1:(\d+) ", lines[0])
    assert listening is not None, lines
    assert "the engine could not start" in lines[1] and "[espeak] extra" in lines[1], lines[1]
    assert "is ready" not in done.stderr and "Traceback" not in done.stderr
    assert _refused(int(listening.group(1)))  # nothing listening once it exited


def test_wyoming_without_espeak_exits_1_naming_the_extra(pythons: Pythons, tmp_path: Path) -> None:
    socket_path = tmp_path / "w.sock"
    done = _run(pythons[".[wyoming,cli]"], "-m", "indextts_client", "wyoming", "--uri", f"unix://{socket_path}")
    assert done.returncode == 1, done.stderr  # espeak is the default engine
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "[espeak] extra" in lines[0], done.stderr
    assert "listening" not in done.stderr and "Traceback" not in done.stderr
    assert not socket_path.exists()  # nothing listening


def test_wyoming_without_its_package_names_the_extra(pythons: Pythons) -> None:
    done = _run(pythons[".[server,cli]"], "-m", "indextts_client", "wyoming", "--uri", "tcp://127.0.0.1:0")
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "indextts-client wyoming: No module named 'wyoming': "
        'install the [wyoming] extra (from the clone: pip install -e ".[wyoming]")\n'
    )


def test_serve_without_its_packages_names_the_extra(pythons: Pythons) -> None:
    done = _run(pythons[".[wyoming,cli]"], "-m", "indextts_client", "serve", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert re.fullmatch(
        r"indextts-client serve: indextts_client\.http needs the \[server\] extra \(No module named '\w+'\): "
        r'from the clone, pip install -e "\.\[server\]"\n',
        done.stderr,
    ), done.stderr


#: Pool.start() in a program of the .[server] venv (asyncio: trio is not part of that install);
#: prints what it raised, whether every member closed, and whether each sidecar was reaped.
POOL_PROGRAM = """
import json, os, anyio
from indextts_client import Pool, StartError

def reaped(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False  # alive or a zombie: not reaped

async def main():
    pool = Pool("espeak", size=2)
    with anyio.fail_after(50):
        try:
            await pool.start()
        except StartError as exc:
            members = pool.members
            pids = [client.pid for client in members if client.pid is not None]
            print(json.dumps({"code": exc.code, "message": str(exc), "closed": [c.closed for c in members],
                              "pids": len(pids), "reaped": [reaped(pid) for pid in pids]}))
        else:
            print(json.dumps({"started": True}))

anyio.run(main)
"""


def test_pool_start_without_espeak_raises_naming_the_extra(pythons: Pythons) -> None:
    done = _run(pythons[".[server]"], "-c", POOL_PROGRAM)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    result = json.loads(done.stdout)
    assert result["code"] == "load_failed" and "[espeak] extra" in result["message"], result
    assert result["closed"] == [True, True] and result["pids"] == 2 and result["reaped"] == [True, True], result


@pytest.mark.anyio
async def test_pool_start_with_sidecars_of_a_venv_without_espeak_raises(pythons: Pythons) -> None:
    # The parent here, its sidecars in the .[server] venv: on both backends, every one reaped.
    pool = Pool("espeak", size=2, python=pythons[".[server]"], env={"PYTHONPATH": REPO})
    with anyio.fail_after(TIMEOUT), pytest.raises(StartError) as raised:
        await pool.start()
    assert raised.value.code == "load_failed" and "[espeak] extra" in str(raised.value), raised.value
    assert all(client.closed for client in pool.members)
    pids = [client.pid for client in pool.members if client.pid is not None]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped: no sidecar left behind


@pytest.mark.anyio
async def test_pool_start_loads_the_engine_unless_told_not_to() -> None:
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", size=2) as pool:
            assert [health.loaded for health in await pool.ping()] == [True, True]
        async with Pool("fake", size=1, load_on_start=False) as pool:
            assert [health.loaded for health in await pool.ping()] == [False]
