"""LiveKit Agents against a real ``serve``: espeak, or the fake engine where audio is compared
byte for byte; each started once per module."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: http_support, ws_support

from http_support import KEY, Server, server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # LiveKit Agents runs on asyncio only


@pytest.fixture(scope="module")
def fake() -> Iterator[Server]:
    """The fake engine: deterministic audio (``render_bytes`` of each sentence) and words."""
    with server("--engine", "fake", "--api-key", KEY) as running:
        yield running


@pytest.fixture(scope="module")
def espeak() -> Iterator[Server]:
    pytest.importorskip("espeakng_loader")
    with server("--engine", "espeak", "--api-key", KEY) as running:
        yield running
