"""Fixtures of the IndexTTS adapter's tests: the stand-in packages on sys.path, their call log."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import STANDIN, make_checkpoints


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[dict[str, Any]]]:
    """The stand-in's call log, as a function returning the entries so far."""
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("INDEXTTS_STANDIN_LOG", str(log))

    def read() -> list[dict[str, Any]]:
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    return read


@pytest.fixture
def ckpt25(tmp_path: Path) -> Path:
    """A complete stand-in IndexTTS-2.5 checkpoint folder."""
    return make_checkpoints(tmp_path / "checkpoints-2.5", version="2.5")


def _forget_indextts() -> None:
    for name in list(sys.modules):
        if name == "indextts" or name.startswith("indextts."):
            del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Put one stand-in flavour (v2, v25, pypi) on sys.path for this test only."""
    _forget_indextts()

    def use(flavour: str) -> None:
        monkeypatch.syspath_prepend(str(STANDIN / flavour))
        importlib.invalidate_caches()

    yield use
    _forget_indextts()


@pytest.fixture(autouse=True)
def _openmp_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A load sets GOMP_SPINCOUNT in this process (``_upstream.openmp_waits``): undone after each test."""
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        # monkeypatch restores what it saw first: a set, then the value as it was (or none).
        value = os.environ.get(name)
        monkeypatch.setenv(name, "")
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
