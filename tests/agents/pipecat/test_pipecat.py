"""IndexTTSService (the WebSocket route) in Pipecat's own pipeline, against ``serve --engine espeak``.

The reference for every figure is the route itself, driven with the ``websockets`` client
(what the service sends, sentence by sentence).  espeak-ng's audio for one text varies from
run to run by up to 0.5% of its length (seen here: 85,854 to 85,900 bytes for one sentence),
so lengths are compared within 5%.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from typing import Any

import pytest
from http_support import KEY, Server, server

pytest.importorskip(
    "pipecat.frames.frames", reason="pipecat-ai is not installed: `bash .ci/agents` runs this in its venv"
)

from pipecat.frames.frames import (
    AggregatedTextFrame,
    ErrorFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.tts_service import TextAggregationMode
from pipecat_support import RATE, WAIT, Collector, Speaker, running
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from indextts_client.integrations.pipecat import IndexTTSService

pytestmark = pytest.mark.anyio

SENTENCES = ["The museum opens at nine.", "Tickets are twelve euros, and children go free."]
REPLY = " ".join(SENTENCES)


def tokens(text: str) -> list[str]:
    """An LLM's tokens: pieces of three characters, mid-word included."""
    return [text[i : i + 3] for i in range(0, len(text), 3)]


async def reply_turn(worker: Any, text: str) -> None:
    await worker.queue_frame(LLMFullResponseStartFrame())
    for token in tokens(text):
        await worker.queue_frame(LLMTextFrame(token))
    await worker.queue_frame(LLMFullResponseEndFrame())


async def route_audio(s: Server, sentences: list[str]) -> tuple[bytes, list[dict[str, Any]]]:
    """What the route gives for ``sentences``, each flushed, in one context: the audio, and the
    ``audio.alignment`` events."""
    url = s.base.replace("http://", "ws://") + "/v1/audio/speech/stream"
    audio, alignments = bytearray(), []
    async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=WAIT) as ws:
        assert json.loads(await ws.recv())["type"] == "session.ready"
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "sample_rate": RATE}))
        for sentence in sentences:
            await ws.send(json.dumps({"type": "input.text", "context_id": "ref", "text": sentence}))
            await ws.send(json.dumps({"type": "input.flush", "context_id": "ref"}))
        await ws.send(json.dumps({"type": "input.done", "context_id": "ref"}))
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                audio += message[1 + message[0] :]
                continue
            event = json.loads(message)
            assert event["type"] != "error", event
            if event["type"] == "audio.alignment":
                alignments.append(event)
            if event["type"] == "context.done":
                return bytes(audio), alignments


def service(s: Server, **kwargs: Any) -> IndexTTSService:
    return IndexTTSService(url=s.base, api_key=KEY, sample_rate=RATE, **kwargs)


def words_of(text: str) -> list[str]:
    return re.findall(r"[A-Za-z']+", text)


async def test_a_whole_reply_is_spoken_sentence_by_sentence(espeak: Server) -> None:
    tts = service(espeak)
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:
        await reply_turn(worker, REPLY)
        await down.wait_for(lambda fs: any(isinstance(f, LLMFullResponseEndFrame) for f in fs), "end of the reply")
    assert up.of(ErrorFrame) == []
    sentences = [f.text for f in down.of(AggregatedTextFrame) if f.will_be_spoken and not isinstance(f, TTSTextFrame)]
    assert sentences == SENTENCES
    audio = b"".join(f.audio for f in down.of(TTSAudioRawFrame))
    expected, _ = await route_audio(espeak, sentences)
    assert len(expected) > RATE  # over half a second of speech
    assert abs(len(audio) - len(expected)) <= 0.05 * len(expected)
    assert {f.sample_rate for f in down.of(TTSAudioRawFrame)} == {RATE}
    assert len(down.of(TTSStoppedFrame)) == 1
    # Every word of the reply reaches downstream as Pipecat's TTSTextFrame, in order.
    spoken = down.of(TTSTextFrame)
    assert words_of(" ".join(f.text for f in spoken)) == words_of(REPLY)
    # One frame per word (the route's audio.alignment), presentation times strictly increasing
    # and within the audio's length.
    assert len(spoken) == len(words_of(REPLY))
    pts = [f.pts for f in spoken]
    assert all(a < b for a, b in itertools.pairwise(pts))
    assert (pts[-1] - pts[0]) / 1e9 < len(audio) / 2 / RATE


async def test_a_refused_voice_surfaces_as_an_error_frame(espeak: Server) -> None:
    tts = service(espeak, voice="no-such-voice")
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:
        await worker.queue_frame(TTSSpeakFrame("Hello there."))
        await up.wait_for(
            lambda fs: any(isinstance(f, ErrorFrame) and "unknown_voice" in f.error for f in fs), "unknown_voice error"
        )
        await down.wait_for(lambda fs: any(isinstance(f, TTSStoppedFrame) for f in fs), "the turn's end")
    assert down.of(TTSAudioRawFrame) == []


async def test_an_interruption_cancels_the_turn_keeps_the_connection_and_cuts_the_transcript_at_a_word(
    espeak: Server,
) -> None:
    tts = service(espeak)
    connections: list[str] = []
    cancelled: list[str] = []
    got_cancel = asyncio.Event()

    @tts.event_handler("on_connected")
    async def _connected(_service: Any) -> None:
        connections.append("connected")

    @tts.event_handler("on_context_cancelled")
    async def _cancelled(_service: Any, context_id: str) -> None:
        cancelled.append(context_id)
        got_cancel.set()

    context = LLMContext()
    assistant = LLMContextAggregatorPair(context).assistant()
    speaker = Speaker()
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    first = "The museum opens at nine."
    async with running([up, tts, speaker, down, assistant]) as worker:
        # The LLM is still writing (no LLMFullResponseEndFrame): the turn's context is open on
        # the server when the user speaks over the first sentence, 0.6 s into its audio.
        await worker.queue_frame(LLMFullResponseStartFrame())
        for token in tokens(first + " Tickets are twelve euros, and chil"):
            await worker.queue_frame(LLMTextFrame(token))
        await speaker.wait_played(int(0.6 * RATE))
        await worker.queue_frame(InterruptionFrame())
        async with asyncio.timeout(WAIT):
            await got_cancel.wait()
        # The next turn is spoken on the same connection.
        await reply_turn(worker, "Yes.")
        await down.wait_for(lambda fs: any(isinstance(f, LLMFullResponseEndFrame) for f in fs), "the next reply")
    assert up.of(ErrorFrame) == []
    assert connections == ["connected"]
    turn = [f.context_id for f in down.of(TTSStartedFrame)]
    assert cancelled == turn[:1] and len(turn) == 2
    heard = speaker.heard
    assert heard is not None and 0.6 * RATE <= heard < 1.0 * RATE
    # The assistant's context holds the interrupted reply up to a word boundary, within one
    # word of the audio played (the words' times from the route's own audio.alignment).
    _, alignments = await route_audio(espeak, [first])
    starts = [w["start"] for w in alignments[0]["words"]]
    assert len(starts) == len(words_of(first))
    said = [m["content"] for m in context.get_messages() if m["role"] == "assistant"]
    assert len(said) == 2 and words_of(said[1]) == ["Yes"]
    kept = words_of(said[0])
    assert kept == words_of(first)[: len(kept)] and 0 < len(kept) < len(starts)
    played = sum(1 for start in starts if start < heard / RATE)
    assert abs(len(kept) - played) <= 1, (kept, played, starts, heard / RATE)


async def read_until_closed(ws: Any) -> list[dict[str, Any]]:
    events = []
    async with asyncio.timeout(WAIT):
        try:
            while True:
                events.append(json.loads(await ws.recv()))
        except ConnectionClosed:
            return events


async def test_keepalives_hold_an_idle_connection_that_the_server_would_close() -> None:
    with server("--engine", "espeak", "--api-key", KEY, "--ws-idle-timeout", "1") as s:
        # Ten keep-alives in each idle timeout.
        tts = service(s, keepalive_interval=0.1)
        connections: list[str] = []
        connected = asyncio.Event()

        @tts.event_handler("on_connected")
        async def _connected(_service: Any) -> None:
            connections.append("connected")
            connected.set()

        up, down = Collector(FrameDirection.UPSTREAM), Collector()
        async with running([up, tts, down]) as worker:
            async with asyncio.timeout(WAIT):
                await connected.wait()
            # The control: a connection opened after the service's, sending nothing, is closed
            # for idleness; the service's, idle as long and longer, is not.
            url = s.base.replace("http://", "ws://") + "/v1/audio/speech/stream"
            async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=WAIT) as ws:
                events = await read_until_closed(ws)
                assert [e.get("code") for e in events] == [None, "idle_timeout"]  # session.ready, then the close
            await worker.queue_frame(TTSSpeakFrame("Still here."))
            await down.wait_for(lambda fs: any(isinstance(f, TTSStoppedFrame) for f in fs), "the turn's end")
        assert up.of(ErrorFrame) == []
        assert connections == ["connected"]
        assert len(down.of(TTSAudioRawFrame)) > 0


async def test_token_aggregation_leaves_the_sentences_to_the_route(espeak: Server) -> None:
    # Pipecat hands each token over as it comes; the route cuts the sentences (and queues the
    # next on the sidecar): the same audio and the same words as with Pipecat's sentences.
    tts = service(espeak, text_aggregation_mode=TextAggregationMode.TOKEN)
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:
        await reply_turn(worker, REPLY)
        await down.wait_for(lambda fs: any(isinstance(f, LLMFullResponseEndFrame) for f in fs), "end of the reply")
    assert up.of(ErrorFrame) == []
    audio = b"".join(f.audio for f in down.of(TTSAudioRawFrame))
    expected, _ = await route_audio(espeak, SENTENCES)
    assert abs(len(audio) - len(expected)) <= 0.05 * len(expected)
    assert words_of(" ".join(f.text for f in down.of(TTSTextFrame))) == words_of(REPLY)
    assert len(down.of(TTSTextFrame)) == len(words_of(REPLY))
