"""Fixtures of the set-up tests: a registry of their own, the stand-in upstream, the CLI as a process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from harness import REPO, STANDIN

#: Seconds one ``indextts-client`` process may take (a bound; these runs take about a second).
CLI_LIMIT = 120


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """INDEXTTS_HOME and HF_HOME in the test's folder; none of the caller's hub settings."""
    folder = tmp_path / "home"
    monkeypatch.setenv("INDEXTTS_HOME", str(folder))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for name in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN", "PYTHONPATH"):
        monkeypatch.delenv(name, raising=False)
    return folder


def fake_distribution(root: Path, name: str, version: str) -> None:
    """A dist-info importlib.metadata finds ``name`` at ``version`` by (for the doctor's version checks)."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def standin_env(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH for this interpreter to run the stand-in upstream IndexTTS-2 (with the torch stub)."""
    dists = tmp_path / "dists"
    fake_distribution(dists, "transformers", "4.52.1")
    path = [str(STANDIN / "v2"), str(STANDIN / "torchstub"), str(dists), REPO]
    return {"PYTHONPATH": os.pathsep.join(path)}


def run_cli(args: Sequence[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``indextts-client ARGS`` in a child process, with this environment plus ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "indextts_client", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=CLI_LIMIT,
        stdin=subprocess.DEVNULL,
    )
