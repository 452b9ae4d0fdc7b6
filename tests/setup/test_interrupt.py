"""Ctrl-C while ``indextts-client`` starts: exit 130 and one line, at every moment of start-up.

The moments are reached deterministically: a finder at the head of ``sys.meta_path`` sends
the process SIGINT when the named module is about to be imported (the first ones while the
console script's entry point is importing the CLI, the last ones while the CLI already runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest
from conftest import CLI_LIMIT

_CHILD = """
import os, signal, sys

at = os.environ["TEST_INTERRUPT_AT"]


class Trigger:
    def find_spec(self, name, path=None, target=None):
        if name == at:
            os.kill(os.getpid(), signal.SIGINT)
        return None


sys.meta_path.insert(0, Trigger())
sys.argv = ["indextts-client", "envs", "--json"]
from indextts_sidecar._client_entry import main

sys.exit(main())
"""

#: Modules imported for the first time at successive moments of ``indextts-client envs``:
#: the client package, its dependencies, the CLI module, then (under the CLI's own handling)
#: setup's modules while the parser is built and the command runs.
MOMENTS = [
    "indextts_client",
    "anyio",
    "numpy",
    "indextts_client._client",
    "indextts_client._cli",
    "indextts_client._setup._command",
    "indextts_client._registry",
]


def test_the_console_script_runs_the_guarded_entry_point() -> None:
    scripts = {e.name: e.value for e in metadata.entry_points(group="console_scripts")}
    assert scripts["indextts-client"] == "indextts_sidecar._client_entry:main"


def _start(moment: str) -> subprocess.CompletedProcess[str]:
    """``indextts-client envs --json`` with a SIGINT sent as ``moment`` is about to be imported."""
    return subprocess.run(
        [sys.executable, "-c", _CHILD],
        env={**os.environ, "TEST_INTERRUPT_AT": moment},
        capture_output=True,
        text=True,
        timeout=CLI_LIMIT,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_during_start_up_is_exit_130_and_one_line(moment: str) -> None:
    result = _start(moment)
    assert result.returncode == 130, result.stderr
    assert result.stderr == "indextts-client: interrupted\n"
    assert result.stdout == ""


def test_without_a_ctrl_c_the_same_child_runs_the_command() -> None:
    # The control: the trigger names a module nobody imports, and envs answers.
    result = _start("no.such.module")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"
