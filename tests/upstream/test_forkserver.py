"""The suite's fork server (``forkserver.py``): a forked start behaves as a cold one would.

The conformance suite runs its sidecars and probes through the server, so these check the
server itself against the real interpreter of the same venv: what a started program sees
(arguments, ``sys.path[0]``, working directory, environment, a session of its own, OpenMP's
variable as the sidecar sets it, numpy seeded afresh), its exit status and signals as the
launcher's own, a killed launcher's child killed, and what cannot be forked run cold.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import flavour_named, forkserver_log

pytestmark = pytest.mark.timeout(300)

#: What a started program reports of itself, then how it ends (argv[1]).
SCRIPT = """
import json, os, signal, sys
imported = "torch" in sys.modules
from indextts_sidecar.engines.indextts._upstream import openmp_waits
waits = openmp_waits()  # as the sidecar does before it imports torch
import numpy, torch
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "pid": os.getpid(),
    "session_leader": os.getsid(0) == os.getpid(), "marker": os.environ.get("INDEXTTS_TEST_MARKER"),
    "openmp": waits, "torch": imported, "random": int(numpy.random.randint(1 << 30)),
}), flush=True)
if sys.argv[1] == "wait":
    signal.pause()
sys.exit(int(sys.argv[1]))
"""
#: Generous bounds: a forked start takes well under a second, a cold one about 10 s.
BOUND = 120


@pytest.fixture
def github() -> Any:
    flavour = flavour_named("2")
    if flavour.python == flavour.real_python:
        pytest.skip("INDEXTTS_UPSTREAM_FORKSERVER=0: no fork server to check")
    return flavour


def started(python: str, script: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    # As the client spawns a sidecar: a session of its own, pipes for the streams.
    return subprocess.Popen(
        [python, str(script), *args],
        env={**os.environ, **github_env(), **env},
        cwd=script.parent,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def github_env() -> dict[str, str]:
    return flavour_named("2").env()


def report(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, process.stderr.read() if process.stderr else ""
    result: dict[str, Any] = json.loads(line)
    return result


def forked_pids(flavour: Any) -> set[int]:
    lines = forkserver_log(flavour).read_text().splitlines()
    return {int(line.split()[2].rstrip(":")) for line in lines if line.split()[1:2] == ["forked"]}


def test_a_forked_start_sees_what_a_cold_one_sees(github: Any, tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(SCRIPT)
    runs = {}
    for name, python in (("cold", github.real_python), ("forked", github.python), ("again", github.python)):
        with started(python, script, "3", INDEXTTS_TEST_MARKER=name) as process:
            runs[name] = report(process)
            assert process.wait(BOUND) == 3, name
            assert process.stdout is not None and process.stdout.read() == ""
    cold, forked, again = runs["cold"], runs["forked"], runs["again"]
    assert {forked["pid"], again["pid"]} <= forked_pids(github)  # forked, not run cold
    assert cold["pid"] not in forked_pids(github)
    for key in ("argv", "path0", "cwd", "session_leader", "openmp"):
        assert forked[key] == cold[key], key
    assert forked["argv"] == [str(script), "3"] and forked["session_leader"] is True
    assert (cold["marker"], forked["marker"]) == ("cold", "forked")
    assert forked["torch"] and not cold["torch"]  # what the server spares
    assert forked["random"] != again["random"]  # numpy seeded afresh in each child


def test_the_launcher_ends_as_its_child_did_and_forwards_signals(github: Any, tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(SCRIPT)
    with started(github.python, script, "wait") as process:
        child = report(process)["pid"]
        assert child != process.pid and child in forked_pids(github)
        os.killpg(process.pid, signal.SIGTERM)  # what the client's stop ladder sends
        assert process.wait(BOUND) == -signal.SIGTERM
        assert process.stdout is not None and process.stdout.read() == ""  # the child's end: its streams closed


def test_a_killed_launcher_takes_its_child_with_it(github: Any, tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(SCRIPT)
    with started(github.python, script, "wait") as process:
        child = report(process)["pid"]
        process.kill()
        process.wait(BOUND)
        # The launcher held none of the streams: their end is the child's (killed by the server).
        assert process.stdout is not None
        done = subprocess.run(["timeout", str(BOUND), "cat"], stdin=process.stdout, capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout == ""
    assert f"the launcher of {child} is gone" in forkserver_log(github).read_text()


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["-c", "import os; print(os.getpid())"], {}),  # an interpreter option
        (["-m", "json.tool", "--help"], {}),  # another module
        (["SCRIPT"], {"HF_HOME": "/nonexistent"}),  # read by huggingface_hub at import
    ],
)
def test_what_cannot_be_forked_runs_cold(github: Any, tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
    script = tmp_path / "pid.py"
    script.write_text("import os\nprint(os.getpid())\n")
    argv = [str(script) if arg == "SCRIPT" else arg for arg in args]
    done = subprocess.run(
        [github.python, *argv], env={**os.environ, **github_env(), **env}, capture_output=True, text=True, timeout=BOUND
    )
    assert done.returncode == 0, done.stderr
    if args[0] != "-m":
        # exec keeps the launcher's process: the pid printed is one the server never forked.
        assert int(done.stdout) not in forked_pids(github)
    log = forkserver_log(github).read_text()
    if args[0] == "-m":  # asked of no server: the launcher knows it runs cold
        assert "json.tool" not in log
    if env:
        assert f"cold: {script}: the environment differs in HF_HOME" in log
