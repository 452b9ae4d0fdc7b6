"""The voice-agent frameworks' suites (tests/agents/<framework>/) run in venvs of their own,
with the framework's pinned version (``bash .ci/agents``).  The main suite leaves them out:
they are collected only when a path under tests/agents/ is named on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _named(config: pytest.Config) -> bool:
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if HERE in collection_path.resolve().parents and not _named(config):
        return True
    return None
