"""SSML from an LLM through both Pipecat services, in Pipecat's own pipeline, on the fake engine:
the reply's tokens split tags anywhere and Pipecat cuts sentences inside them (a ``.`` in
``time="1.5s"``), yet each tag reaches the reader whole and each break is an exact silence."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from http_support import KEY, Server, server, silence_runs

pytest.importorskip("pipecat.frames.frames", reason="pipecat-ai is not installed: `bash .ci/agents` runs it")
pytest.importorskip("defusedxml", reason="the ssml extra (defusedxml) is not installed")

from pipecat.frames.frames import (
    ErrorFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat_support import RATE, Collector, running

from indextts_client import Client
from indextts_client.integrations.pipecat import IndexTTSInProcessService, IndexTTSService
from indextts_sidecar.engines.fake import render

pytestmark = pytest.mark.anyio

REPLY = '<speak>Hi there.<break time="0.5s"/>Go <sub alias="now">x</sub>.</speak>'


@pytest.fixture(scope="module")
def fake() -> Iterator[Server]:
    with server("--engine", "fake", "--api-key", KEY) as s:
        yield s


async def _speak(tts: object) -> tuple[bytes, list[ErrorFrame]]:
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:  # type: ignore[list-item]
        await worker.queue_frame(LLMFullResponseStartFrame())
        for i in range(0, len(REPLY), 3):  # an LLM's tokens: tags cut anywhere
            await worker.queue_frame(LLMTextFrame(REPLY[i : i + 3]))
        await worker.queue_frame(LLMFullResponseEndFrame())
        await down.wait_for(lambda fs: any(isinstance(f, TTSStoppedFrame) for f in fs), "the turn's end")
    return b"".join(f.audio for f in down.of(TTSAudioRawFrame)), up.of(ErrorFrame)


def _expected_runs() -> list[tuple[bool, int]]:
    # the fake engine's tones are never zero: the only silence is the break's, 0.5 s exactly
    spoken = len(render("Hi there.", RATE))
    return [(False, spoken), (True, RATE // 2), (False, len(render("Go now.", RATE)))]


async def test_the_websocket_service_speaks_ssml(fake: Server) -> None:
    audio, errors = await _speak(IndexTTSService(url=fake.base, api_key=KEY, sample_rate=RATE, text_format="ssml"))
    assert errors == []
    assert silence_runs(audio) == _expected_runs()


async def test_the_in_process_service_speaks_ssml() -> None:
    async with Client("fake") as client:
        audio, errors = await _speak(IndexTTSInProcessService(client, sample_rate=RATE, text_format="ssml"))
    assert errors == []
    assert silence_runs(audio) == _expected_runs()


def test_an_unknown_text_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text_format"):
        IndexTTSService(text_format="html")
