"""A failed install names its real cause, read from the installer's own output (pip's, uv's, git's)."""

from __future__ import annotations

import pytest

from indextts_client._setup._build import diagnose

GIT_UNREACHABLE = """\
   Updating https://github.com/index-tts/index-tts (ee40fa7d6c6b8a2c7f06105f9f1e65775b74868c)
error: Failed to download and build `indextts @ git+https://github.com/index-tts/index-tts@ee40fa7`
  Caused by: Git operation failed
  Caused by: process didn't exit successfully: `/usr/bin/git fetch --force 'https://github.com/index-tts/index-tts'`
--- stderr
fatal: unable to access 'https://github.com/index-tts/index-tts/': Could not resolve host: github.com
"""

PIP_TORCH_INDEX = """\
Looking in indexes: https://pypi.org/simple, https://download.pytorch.org/whl/cu128
WARNING: Retrying (Retry(total=4)) after connection broken by 'NewConnectionError(': Failed to establish a new \
connection: [Errno -3] Temporary failure in name resolution')': /whl/cu128/torch/
WARNING: Could not fetch URL https://download.pytorch.org/whl/cu128/torch/: HTTPSConnectionPool(\
host='download.pytorch.org', port=443): Max retries exceeded with url: /whl/cu128/torch/ - skipping
ERROR: Could not find a version that satisfies the requirement torch==2.8.0 (from versions: none)
ERROR: No matching distribution found for torch==2.8.0
"""

PIP_MANAGED = """\
error: externally-managed-environment

\u00d7 This environment is externally managed
╰─> To install Python packages system-wide, try apt install python3-xyz
"""

NO_PIP = "/home/u/venv/bin/python: No module named pip\n"

PIP_NOT_FOUND = """\
ERROR: Could not find a version that satisfies the requirement indextts2-inference==9.9 (from versions: 2.1.1)
ERROR: No matching distribution found for indextts2-inference==9.9
"""

UV_NOT_FOUND = """\
  \u00d7 No solution found when resolving dependencies:
  ╰─▶ Because no-such-package was not found in the package registry and you require no-such-package, we can
      conclude that your requirements are unsatisfiable.
"""


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (GIT_UNREACHABLE, "cannot reach github.com: --source github clones upstream from GitHub: use --source pypi"),
        (PIP_TORCH_INDEX, "cannot reach download.pytorch.org: --torch pypi takes torch from the package index"),
        (PIP_MANAGED, "the interpreter is an externally managed (system) Python, which takes no packages"),
        (NO_PIP, "that venv has no pip: use --installer uv"),
        (PIP_NOT_FOUND, "no version of indextts2-inference==9.9 that fits was found on the package index"),
        (UV_NOT_FOUND, "no version of no-such-package that fits was found on the package index"),
    ],
    ids=["git", "torch-index", "externally-managed", "no-pip", "pip-requirement", "uv-requirement"],
)
def test_the_cause_is_read_from_the_installers_output(output: str, expected: str) -> None:
    cause = diagnose(output)
    assert cause is not None and cause.startswith(expected), cause


def test_output_without_a_known_cause_is_left_to_the_log() -> None:
    assert diagnose("Building wheel for something (pyproject.toml) ... error\n") is None
