"""SSML through the LiveKit TTS (``text_format="ssml"``) against a real ``serve`` on the fake
engine: LiveKit's stream and chunked stream, the tags of an LLM's reply cut anywhere, each break
an exact silence between the fake engine's tones."""

from __future__ import annotations

import pytest

pytest.importorskip("livekit.agents")
pytest.importorskip("defusedxml", reason="the ssml extra (defusedxml) is not installed")

from http_support import KEY, Server, silence_runs
from livekit.agents import APIConnectOptions, tts
from livekit_support import WAIT

from indextts_client.integrations.livekit import TTS
from indextts_sidecar.engines.fake import render

pytestmark = pytest.mark.anyio

REPLY = '<speak>Hi there.<break time="0.5s"/>Go <sub alias="now">x</sub>.</speak>'
NO_RETRY = APIConnectOptions(max_retry=0, timeout=WAIT)


def _runs(frames: list[tts.SynthesizedAudio]) -> list[tuple[bool, int]]:
    return silence_runs(b"".join(ev.frame.data.tobytes() for ev in frames))


EXPECTED = [(False, len(render("Hi there."))), (True, 12000), (False, len(render("Go now.")))]


async def test_a_streamed_ssml_reply(fake: Server) -> None:
    speaker = TTS(url=fake.base, api_key=KEY, text_format="ssml")
    try:
        async with speaker.stream(conn_options=NO_RETRY) as stream:
            for i in range(0, len(REPLY), 3):
                stream.push_text(REPLY[i : i + 3])
            stream.end_input()
            frames = [ev async for ev in stream]
    finally:
        await speaker.aclose()
    assert _runs(frames) == EXPECTED


async def test_a_chunked_ssml_text(fake: Server) -> None:
    speaker = TTS(url=fake.base, api_key=KEY, text_format="ssml")
    try:
        frames = [ev async for ev in speaker.synthesize(REPLY, conn_options=NO_RETRY)]
    finally:
        await speaker.aclose()
    assert _runs(frames) == EXPECTED


def test_an_unknown_text_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text_format"):
        TTS(text_format="html")
