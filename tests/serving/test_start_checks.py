"""Start only what can speak: ``serve``, ``wyoming`` and ``Pool.start()`` load the engine before
they say they are ready, and an engine that cannot load ends the start-up with exit 1 and one
line that names the extra to install.

The interpreters here are the test venv made to lack what a venv holding only the documented
extras lacks (``.[server]``, ``.[server,cli]``, ``.[wyoming,cli]``, each without ``[espeak]``):
tests/without_extras/sitecustomize.py hides those packages from the path finder, so ``import``
fails with "No module named ..." and ``find_spec`` answers None, in this process's children
and theirs (the sidecars).  A venv built with only those extras would test the same import
failures at the cost of a package install; the hidden list below is the extras' own modules
(pyproject.toml) and the test tools.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from harness import REPO

from indextts_client import Pool, StartError

#: Top-level modules of each extra that a venv of the documented extras may lack.
EXTRA_MODULES = {
    "espeak": ["espeakng_loader"],
    "cli": ["rich", "uv", "huggingface_hub", "platformdirs"],
    "audio": ["soundfile", "soxr"],
    "server": ["starlette", "uvicorn", "prometheus_client", "av", "multipart", "python_multipart", "websockets"],
    "realtime": ["sentence_stream"],
    "wyoming": ["wyoming"],
}
#: What only the test extras bring.
TEST_MODULES = ["httpx", "trio", "hypothesis", "openai", "selenium"]
#: The extras each documented install brings (server and wyoming bring realtime).
INSTALLS = {
    ".[server]": {"server", "realtime"},
    ".[server,cli]": {"server", "realtime", "cli"},
    ".[wyoming,cli]": {"wyoming", "realtime", "cli"},
}
WITHOUT_EXTRAS = str(Path(REPO) / "tests" / "without_extras")
TIMEOUT = 60


def _environment(install: str) -> dict[str, str]:
    kept = INSTALLS[install]
    hidden = [module for extra, modules in EXTRA_MODULES.items() if extra not in kept for module in modules]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([WITHOUT_EXTRAS, REPO]),
        "INDEXTTS_TEST_WITHOUT": ",".join([*hidden, *TEST_MODULES]),
    }


def _run(install: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "indextts_client", *args],
        capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL, env=_environment(install),
    )  # fmt: skip


def _refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_the_hidden_packages_are_missing_in_the_child() -> None:
    code = "import importlib.util as u; print([u.find_spec(m) is None for m in ('espeakng_loader', 'starlette')])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, env=_environment(".[server]")
    )
    assert done.stdout.strip() == "[True, False]", done.stderr


@pytest.mark.parametrize("install", [".[server]", ".[server,cli]"])
def test_serve_without_espeak_exits_1_naming_the_extra(install: str) -> None:
    done = _run(install, "serve", "--engine", "espeak", "--port", "0")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    # The line that says where it listened, then the one that says why it stopped: nothing else.
    assert len(lines) == 2, done.stderr
    listening = re.search(r"listening on http://127\.0\.0\.1:(\d+) ", lines[0])
    assert listening is not None, lines
    assert "the engine could not start" in lines[1] and "[espeak] extra" in lines[1], lines[1]
    assert "is ready" not in done.stderr and "Traceback" not in done.stderr
    assert _refused(int(listening.group(1)))  # nothing listening once it exited


def test_wyoming_without_espeak_exits_1_naming_the_extra(tmp_path: Path) -> None:
    socket_path = tmp_path / "w.sock"
    done = _run(".[wyoming,cli]", "wyoming", "--uri", f"unix://{socket_path}", "--engine", "espeak")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "[espeak] extra" in lines[0], done.stderr
    assert "listening" not in done.stderr and "Traceback" not in done.stderr
    assert not socket_path.exists()  # nothing listening


def test_wyoming_without_its_package_names_the_extra() -> None:
    done = _run(".[server,cli]", "wyoming", "--uri", "tcp://127.0.0.1:0", "--engine", "fake")
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "indextts-client wyoming: No module named 'wyoming': "
        'install the [wyoming] extra (from the clone: pip install -e ".[wyoming]")\n'
    )


def test_serve_without_its_packages_names_the_extra() -> None:
    done = _run(".[wyoming,cli]", "serve", "--engine", "fake", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert re.fullmatch(
        r"indextts-client serve: indextts_client\.http needs the \[server\] extra \(No module named '\w+'\): "
        r'from the clone, pip install -e "\.\[server\]"\n',
        done.stderr,
    ), done.stderr


@pytest.mark.anyio
async def test_pool_start_without_espeak_raises_naming_the_extra() -> None:
    env = _environment(".[server]")
    child = {key: env[key] for key in ("PYTHONPATH", "INDEXTTS_TEST_WITHOUT")}
    pool = Pool("espeak", size=2, env=child)
    with anyio.fail_after(TIMEOUT), pytest.raises(StartError) as raised:
        await pool.start()
    assert raised.value.code == "load_failed" and "[espeak] extra" in str(raised.value), raised.value
    assert all(client.closed for client in pool.members)
    for pid in [client.pid for client in pool.members if client.pid is not None]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped: no sidecar left behind


@pytest.mark.anyio
async def test_pool_start_loads_the_engine_unless_told_not_to() -> None:
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", size=2) as pool:
            assert [health.loaded for health in await pool.ping()] == [True, True]
        async with Pool("fake", size=1, load_on_start=False) as pool:
            assert [health.loaded for health in await pool.ping()] == [False]
