"""Pipecat's suite: a real ``indextts-client serve --engine espeak`` per module, Pipecat on asyncio."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from http_support import KEY, Server, server

# Each test module starts with an importorskip of Pipecat (module-level skips are for test
# modules, not conftests).


def pytest_configure(config: pytest.Config) -> None:
    # Warnings stay errors for this project's code.  Pipecat's own tts_service module defines a
    # deprecated class on a deprecated class, which warns as Pipecat imports it: Pipecat's to fix.
    config.addinivalue_line("filterwarnings", "ignore:`AudioContextTTSService` is deprecated:DeprecationWarning")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Pipecat runs on asyncio only


@pytest.fixture(scope="module")
def espeak() -> Iterator[Server]:
    """``serve --engine espeak`` with a key, its sidecar up."""
    pytest.importorskip("espeakng_loader", reason="the espeak engine's library (extra espeak) is not installed")
    with server("--engine", "espeak", "--api-key", KEY) as s:
        yield s
