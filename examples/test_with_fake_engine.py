"""Testing an application with the fake engine: copy this file into your project's tests.

::

    pip install -e /path/to/indextts-sidecar pytest anyio   # a clone of this repository
    pytest -q examples/test_with_fake_engine.py

The fake engine needs no model and no extra dependencies.  Its audio is a pure function
of the text, so a test can compare samples exactly (``render_bytes``), and request
options inject faults: ``crash_at`` ends the process, ``hang_at`` blocks the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from indextts_client import Client, CrashedError, InvalidRequestError, RequestTimeoutError
from indextts_sidecar.engines.fake import render_bytes

SAMPLE_RATE = 16000
SECONDS_PER_CHAR = 0.01

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    # Return "trio" (or parametrize over both) to run the same tests under trio.
    return "asyncio"


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with Client(
        "fake",
        engine_options={"sample_rate": SAMPLE_RATE, "seconds_per_char": SECONDS_PER_CHAR, "chunk_seconds": 0.05},
        restart_backoff=0.01,  # respawn quickly after the crash test
        sidecar_args=["--log-level", "WARNING"],
    ) as client:
        yield client


async def test_exact_audio(client: Client) -> None:
    audio = await client.synthesize("Hello, test.")
    assert audio.sample_rate == SAMPLE_RATE
    assert audio.samples.tobytes() == render_bytes("Hello, test.", SAMPLE_RATE, seconds_per_char=SECONDS_PER_CHAR)


async def test_streamed_chunks_add_up_to_the_same_audio(client: Client) -> None:
    received = bytearray()
    async with client.stream("streamed") as chunks:
        async for chunk in chunks:
            assert chunk.offset_samples == len(received) // 2
            received += chunk.samples.tobytes()
    assert bytes(received) == render_bytes("streamed", SAMPLE_RATE, seconds_per_char=SECONDS_PER_CHAR)


async def test_invalid_voice_is_rejected(client: Client) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        await client.synthesize("hi", voice="missing:alice")
    assert caught.value.code == "invalid_input"


async def test_crash_fails_the_request_and_the_next_call_respawns(client: Client) -> None:
    pid = client.pid
    with pytest.raises(CrashedError) as caught:
        await client.synthesize("this request kills the sidecar", crash_at=1, exit_code=70)
    assert caught.value.exit_code == 70
    assert "crashing" in caught.value.stderr_tail

    audio = await client.synthesize("after the crash")
    assert len(audio) > 0
    assert client.restarts == 1
    assert client.pid != pid


async def test_hang_hits_the_idle_timeout_and_the_sidecar_lives_on(client: Client) -> None:
    # Load first: a model loaded by the request itself would count against its idle timeout.
    await client.load()
    with pytest.raises(RequestTimeoutError) as caught:
        await client.synthesize("this request hangs", hang_at=0, idle_timeout=0.3)
    assert caught.value.deadline == "idle_timeout"

    health = await client.ping()
    assert health.loaded
    assert client.restarts == 0
