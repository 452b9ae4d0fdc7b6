"""SSML over Wyoming, with the ``wyoming`` package's own client and events: ``Synthesize``
and ``SynthesizeStart`` with ``text_format=SSML``, and ``describe`` saying it reads SSML."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

pytest.importorskip("wyoming")
pytest.importorskip("defusedxml")

from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeTextFormat,
)

from indextts_client import Pool
from indextts_client.wyoming import WyomingService, serve
from indextts_sidecar.engines.fake import render

pytestmark = pytest.mark.anyio
TIMEOUT = 30
SSML = '<speak>ab. <break time="125ms"/><sub alias="cd">x</sub></speak>'


def expected() -> bytes:
    return np.concatenate([render("ab. ", 24000), np.zeros(3000, "<i2"), render("cd", 24000)]).tobytes()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def address() -> AsyncIterator[tuple[str, int]]:
    service = WyomingService(Pool("fake", ready_timeout=TIMEOUT), languages=["en"])
    ready = asyncio.Event()
    where: list[str] = []

    def on_ready(at: str) -> None:
        where.append(at)
        ready.set()

    task = asyncio.create_task(serve(service, "tcp://127.0.0.1:0", ready=on_ready, handle_signals=False))
    await asyncio.wait_for(ready.wait(), TIMEOUT)
    host, port = where[0].removeprefix("tcp://").rsplit(":", 1)
    try:
        yield host, int(port)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def _until(client: AsyncTcpClient, last: str) -> list[Event]:
    events = []
    while True:
        event = await asyncio.wait_for(client.read_event(), TIMEOUT)
        assert event is not None
        events.append(event)
        if event.type in (last, "error"):
            return events


def _audio(events: list[Event]) -> bytes:
    return b"".join(AudioChunk.from_event(e).audio for e in events if AudioChunk.is_type(e.type))


async def test_describe_says_it_reads_ssml(address: tuple[str, int]) -> None:
    async with AsyncTcpClient(*address) as client:
        await client.write_event(Describe().event())
        (program,) = Info.from_event((await _until(client, "info"))[-1]).tts
    assert "text_format: text, ssml" in (program.description or "")


async def test_synthesize_with_text_format_ssml(address: tuple[str, int]) -> None:
    async with AsyncTcpClient(*address) as client:
        await client.write_event(Synthesize(SSML, text_format=SynthesizeTextFormat.SSML).event())
        spoken = await _until(client, AudioStop().event().type)
        await client.write_event(Synthesize(SSML).event())  # no format: spoken as written
        plain = await _until(client, AudioStop().event().type)
        await client.write_event(Synthesize("<speak><audio/></speak>", text_format=SynthesizeTextFormat.SSML).event())
        refused = await _until(client, "error")
    assert _audio(spoken) == expected()
    assert _audio(plain) == render(SSML, 24000).tobytes()
    error = Error.from_event(refused[-1])
    assert error.code == "unsupported" and "line 1, column 8" in error.text


async def test_streamed_synthesis_with_text_format_ssml(address: tuple[str, int]) -> None:
    async with AsyncTcpClient(*address) as client:
        await client.write_event(SynthesizeStart(text_format=SynthesizeTextFormat.SSML).event())
        for i in range(0, len(SSML), 4):  # tags cut across chunks
            await client.write_event(SynthesizeChunk(SSML[i : i + 4]).event())
        await client.write_event(SynthesizeStop().event())
        events = await _until(client, SynthesizeStopped().event().type)
    assert _audio(events) == expected()
