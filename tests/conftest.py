"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import make_checkpoints

# The registry of `indextts-client setup` decides which interpreter Client("indextts2") spawns:
# no test may see the registry of the machine it runs on (tests/setup/ give each test its own).
os.environ["INDEXTTS_HOME"] = tempfile.mkdtemp(prefix="indextts-home-")

try:
    from hypothesis import settings
except ImportError:  # the Ray suite's own venv (.ci/ray) has no hypothesis: nothing to configure
    pass
else:
    # Property tests check results, not speed: hypothesis's default 200 ms deadline per example
    # fails them on a loaded 2-core machine (seen at 290 ms).  Speed is for bench/.
    settings.register_profile("indextts", deadline=None)
    settings.load_profile("indextts")


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A complete stand-in IndexTTS checkpoint folder."""
    return make_checkpoints(tmp_path / "checkpoints")


@pytest.fixture
def voice(tmp_path: Path) -> str:
    """A readable (stand-in) speaker reference clip."""
    path = tmp_path / "speaker.wav"
    path.write_bytes(b"RIFF stand-in speaker")
    return str(path)


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short private directory: a Unix socket path must fit in about 100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="itts-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
