"""The Pipecat services when the engine is slow, fails mid-turn or hangs: the fake engine's
request options (``delay``, ``fail_at``, ``hang_at``) through the route's ``session.config``
and through ``stream_text``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from http_support import KEY, Server, server

pytest.importorskip("pipecat.frames.frames", reason="pipecat-ai is not installed: `bash .ci/agents` runs it")

from pipecat.frames.frames import (
    ErrorFrame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat_support import RATE, WAIT, Collector, running

from indextts_client import Client
from indextts_client.integrations.pipecat import IndexTTSInProcessService, IndexTTSService

pytestmark = pytest.mark.anyio

TEXT = "Hello there, general Kenobi."


@pytest.fixture(scope="module")
def fake() -> Iterator[Server]:
    with server("--engine", "fake", "--api-key", KEY) as s:
        yield s


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with Client("fake") as c:
        yield c


def stopped(frames: list[Any]) -> bool:
    return any(isinstance(f, TTSStoppedFrame) for f in frames)


async def test_a_first_audio_slower_than_pipecats_default_wait_is_still_spoken(fake: Server) -> None:
    # Pipecat ends a turn's audio after 3 s without any by default; IndexTTS can take longer to
    # a sentence's first audio.  One chunk after 4 s of "compute": all of it arrives.
    tts = IndexTTSService(url=fake.base, api_key=KEY, sample_rate=RATE, options={"delay": 4.0, "chunk_seconds": 30.0})
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:
        await worker.queue_frame(TTSSpeakFrame(TEXT))
        await down.wait_for(stopped, "the turn's end")
    assert up.of(ErrorFrame) == []
    assert sum(len(f.audio) for f in down.of(TTSAudioRawFrame)) == 2 * 1440 * len(TEXT)


async def test_an_engine_failure_mid_turn_is_an_error_frame_and_ends_the_turn(fake: Server) -> None:
    tts = IndexTTSService(url=fake.base, api_key=KEY, sample_rate=RATE, options={"fail_at": 1, "chunk_seconds": 0.25})
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:
        await worker.queue_frame(TTSSpeakFrame(TEXT))
        await up.wait_for(lambda fs: any(isinstance(f, ErrorFrame) for f in fs), "an error")
        await down.wait_for(stopped, "the turn's end")
    errors = [f.error for f in up.of(ErrorFrame)]
    assert any("injected failure" in e for e in errors), errors
    # The chunk before the failure (0.25 s) was played.
    assert sum(len(f.audio) for f in down.of(TTSAudioRawFrame)) >= 2 * RATE // 4


async def test_an_interruption_cancels_a_turn_the_engine_is_still_working_on(fake: Server) -> None:
    # The engine hangs before its second chunk until the request is cancelled: only the route's
    # cancel on the sidecar ends it, and the cancel's confirmation says it did.
    tts = IndexTTSService(url=fake.base, api_key=KEY, sample_rate=RATE, options={"hang_at": 1, "chunk_seconds": 0.25})
    cancelled: list[str] = []
    confirmed = asyncio.Event()

    @tts.event_handler("on_context_cancelled")
    async def _cancelled(_service: Any, context_id: str) -> None:
        cancelled.append(context_id)
        confirmed.set()

    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:
        await worker.queue_frame(TTSSpeakFrame(TEXT))
        await down.wait_for(lambda fs: any(isinstance(f, TTSAudioRawFrame) for f in fs), "the first audio")
        await worker.queue_frame(InterruptionFrame())
        async with asyncio.timeout(WAIT):
            await confirmed.wait()
    assert up.of(ErrorFrame) == []
    assert cancelled == [f.context_id for f in down.of(TTSStartedFrame)]
    assert sum(len(f.audio) for f in down.of(TTSAudioRawFrame)) == 2 * RATE // 4


async def test_in_process_an_interruption_cancels_the_request_on_the_sidecar(client: Client) -> None:
    tts = IndexTTSInProcessService(client, sample_rate=RATE, options={"hang_at": 1, "chunk_seconds": 0.25})
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:
        await worker.queue_frame(TTSSpeakFrame(TEXT))
        await down.wait_for(lambda fs: any(isinstance(f, TTSAudioRawFrame) for f in fs), "the first audio")
        assert (await client.ping()).active == 1  # the hanging request
        await worker.queue_frame(InterruptionFrame())
        async with asyncio.timeout(WAIT):
            while (await client.ping()).active:  # each ping is a round trip to the sidecar
                pass
    assert up.of(ErrorFrame) == []
    assert sum(len(f.audio) for f in down.of(TTSAudioRawFrame)) == 2 * RATE // 4


async def test_in_process_an_engine_failure_is_an_error_frame(client: Client) -> None:
    tts = IndexTTSInProcessService(client, sample_rate=RATE, options={"fail_at": 1, "chunk_seconds": 0.25})
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:
        await worker.queue_frame(TTSSpeakFrame(TEXT))
        await up.wait_for(lambda fs: any(isinstance(f, ErrorFrame) for f in fs), "an error")
        await down.wait_for(stopped, "the turn's end")
    errors = [f.error for f in up.of(ErrorFrame)]
    assert any("injected failure" in e for e in errors), errors
