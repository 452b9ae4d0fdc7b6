"""The LiveKit TTS against a real ``serve``: LiveKit's own stream, chunked stream and stream
adapter, their frames compared with the fake engine's exact audio and the bare WebSocket route's
words, the interruption seen on the wire, and refusals as LiveKit's error types."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("livekit.agents")

from harness import STANDIN
from http_support import KEY, Server, environ, server
from livekit.agents import APIConnectionError, APIConnectOptions, APIStatusError, tokenize, tts
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit_support import WAIT, bare_route, recording_session, timed_words

from indextts_client.integrations.livekit import TTS
from indextts_sidecar.engines.fake import render_bytes

pytestmark = pytest.mark.anyio

#: An LLM's reply as it streams: split mid-word, two sentences.
PIECES = ["Hello there, ", "this is a te", "st of LiveKit. ", "And a second sentence follows."]
REPLY = "".join(PIECES)
NO_RETRY = APIConnectOptions(max_retry=0, timeout=WAIT)


def words_of(frames: list[tts.SynthesizedAudio]) -> list[Any]:
    return [w for ev in frames for w in ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]


def pcm_of(frames: list[tts.SynthesizedAudio]) -> bytes:
    return b"".join(ev.frame.data.tobytes() for ev in frames)


async def drain(stream: tts.SynthesizeStream, text: str) -> list[tts.SynthesizedAudio]:
    """``text`` pushed in whole, every event the stream gives."""
    async with stream:
        stream.push_text(text)
        stream.end_input()
        return [ev async for ev in stream]


def spoken(events: list[dict[str, Any]]) -> bytes:
    """The fake engine's exact audio for the sentences the route announced."""
    return b"".join(render_bytes(e["text"]) for e in events if e["type"] == "audio.start")


async def test_a_streamed_reply_is_the_routes_audio_with_its_words_timed(fake: Server) -> None:
    expected, events = await bare_route(fake, *PIECES)
    assert expected == spoken(events)
    speaker = TTS(url=fake.base, api_key=KEY)
    try:
        with anyio.fail_after(WAIT):
            async with speaker.stream() as stream:
                for piece in PIECES:
                    stream.push_text(piece)
                stream.end_input()
                frames = [ev async for ev in stream]
    finally:
        await speaker.aclose()
    assert pcm_of(frames) == expected
    assert all(ev.frame.sample_rate == 24000 and ev.frame.num_channels == 1 for ev in frames)
    assert len({ev.segment_id for ev in frames}) == 1
    assert [ev.is_final for ev in frames] == [False] * (len(frames) - 1) + [True]
    words = words_of(frames)
    assert "".join(words) == REPLY  # each word carries its spaces and punctuation
    assert [w.strip(" ,.") for w in words] == REPLY.replace(",", "").replace(".", "").split()
    expected_times = timed_words(events)
    assert len(expected_times) == len(words)
    for word, (start, end) in zip(words, expected_times, strict=True):
        assert word.start_time == pytest.approx(start, abs=1e-6)
        assert word.end_time == pytest.approx(end, abs=1e-6)
    assert words[-1].end_time <= len(expected) / 2 / 24000 + 1e-6


async def test_streams_at_once_share_the_socket_each_with_its_own_audio(fake: Server) -> None:
    http, traffic = recording_session()
    speaker = TTS(url=fake.base, api_key=KEY, http_session=http)
    texts = ["The first of three replies.", "A second one, a little longer than the first.", "Third."]
    try:
        with anyio.fail_after(WAIT):
            replies = await asyncio.gather(*(drain(speaker.stream(), text) for text in texts))
    finally:
        await speaker.aclose()
        await http.close()
    assert [pcm_of(frames) for frames in replies] == [render_bytes(text) for text in texts]
    assert ["".join(words_of(frames)) for frames in replies] == texts
    events = [item for item in traffic.received() if isinstance(item, dict)]
    assert [e["type"] for e in events].count("session.ready") == 1
    assert len({e["context_id"] for e in events if e["type"] == "context.done"}) == 3


async def test_prewarm_opens_the_socket_and_options_apply_to_the_next_stream(fake: Server) -> None:
    http, traffic = recording_session()
    speaker = TTS(url=fake.base, api_key=KEY, http_session=http, sample_rate=16000)
    try:
        with anyio.fail_after(WAIT):
            speaker.prewarm()
            await traffic.until(lambda item: isinstance(item, dict) and item["type"] == "session.ready")
            assert traffic.sent() == []
            speaker.update_options(voice="echo", speed=1.5)
            frames = await drain(speaker.stream(), "Hello there.")
    finally:
        await speaker.aclose()
        await http.close()
    config = traffic.sent()[0]
    assert config == {
        "type": "context.config",
        "context_id": config["context_id"],
        "voice": "echo",
        "response_format": "pcm",
        "sample_rate": 16000,
        "speed": 1.5,
    }
    assert all(ev.frame.sample_rate == 16000 for ev in frames)
    assert [item["type"] for item in traffic.received() if isinstance(item, dict)].count("session.ready") == 1


async def test_synthesize_is_one_context_with_the_routes_audio(fake: Server) -> None:
    text = "One whole sentence, said at once."
    speaker = TTS(url=fake.base, api_key=KEY)
    try:
        with anyio.fail_after(WAIT):
            async with speaker.synthesize(text) as chunked:
                frames = [ev async for ev in chunked]
    finally:
        await speaker.aclose()
    assert pcm_of(frames) == render_bytes(text)
    words = words_of(frames)
    assert "".join(words) == text
    # the fake engine: 0.06 s a character, "One" characters 0-3, "whole" 4-9
    assert [(w.start_time, w.end_time) for w in words][:2] == [(0.0, 0.18), (0.24, 0.54)]


async def test_the_frameworks_stream_adapter_speaks_through_synthesize(fake: Server) -> None:
    # LiveKit's adapter splits sentences itself and calls synthesize() per sentence.
    expected = render_bytes("Hello there, this is a test of LiveKit.") + render_bytes("And a second sentence follows.")
    speaker = TTS(url=fake.base, api_key=KEY)
    adapter = tts.StreamAdapter(tts=speaker, sentence_tokenizer=tokenize.basic.SentenceTokenizer())
    try:
        with anyio.fail_after(WAIT):
            async with adapter.stream() as stream:
                for piece in PIECES:
                    stream.push_text(piece)
                stream.end_input()
                frames = [ev async for ev in stream]
    finally:
        await adapter.aclose()
        await speaker.aclose()
    # then the emitter's own end-of-segment marker: 10 ms of silence after a flushed segment
    assert pcm_of(frames) == expected + b"\0" * 480


async def test_indextts_segments_stand_in_for_words_over_the_text_sent(ckpt: Path, voice: str) -> None:
    # IndexTTS gives no word alignment: its segments, with the engine's own (upper-cased) text and
    # no offsets, become pieces of the text sent, cut in proportion, timed as the segments.
    env = environ(PYTHONPATH=os.pathsep.join([str(STANDIN / "v2"), os.environ.get("PYTHONPATH", "")]))
    args = ("--engine", "indextts2", "-O", f"model_dir={ckpt}", "--voice", f"alloy={voice}", "--api-key", KEY)
    segmented = {"max_text_tokens_per_segment": 2, "interval_silence": 100}  # "A B", "C D", "E"
    with server(*args, env=env) as running:
        speaker = TTS(url=running.base, api_key=KEY, sample_rate=22050, options=segmented)
        try:
            with anyio.fail_after(WAIT):
                frames = await drain(speaker.stream(), "a b c d e")
        finally:
            await speaker.aclose()
    assert len(pcm_of(frames)) == 2 * 15435
    words = [(str(w), w.start_time, w.end_time) for w in words_of(frames)]
    assert words == [
        ("a b ", 0.0, pytest.approx(6615 / 22050, abs=1e-6)),
        ("c d ", pytest.approx(6615 / 22050, abs=1e-6), pytest.approx(13230 / 22050, abs=1e-6)),
        ("e", pytest.approx(13230 / 22050, abs=1e-6), pytest.approx(15435 / 22050, abs=1e-6)),
    ]


async def test_closing_a_stream_cancels_its_context_at_once(fake: Server) -> None:
    # The fake engine sends each sentence's first 0.5 s, then hangs until the request is
    # cancelled: the context cannot end before the user interrupts it.
    http, traffic = recording_session()
    hanging = {"chunk_seconds": 0.5, "hang_at": 1}
    speaker = TTS(url=fake.base, api_key=KEY, http_session=http, options=hanging)
    long = " ".join(f"This is sentence number {i} of a long answer." for i in range(12))
    try:
        with anyio.fail_after(WAIT):
            stream = speaker.stream()
            stream.push_text(long)
            stream.end_input()
            first = await stream.__anext__()  # the user talks over the first audio
            assert first.frame.samples_per_channel > 0
            await stream.aclose()
            context = traffic.sent()[0]["context_id"]
            # the cancel has gone before aclose() returned
            assert traffic.sent()[-1] == {"type": "context.cancel", "context_id": context}
            cancelled = {"type": "context.cancelled", "context_id": context}
            await traffic.until(lambda item: item == cancelled)

            # the same socket serves the next turn, and nothing more of the cancelled one comes
            speaker.update_options(options={})
            async with speaker.stream() as again:
                again.push_text("Next turn.")
                again.end_input()
                assert pcm_of([ev async for ev in again])
    finally:
        await speaker.aclose()
        await http.close()
    received = traffic.received()
    after = received[received.index(cancelled) + 1 :]
    assert not [item for item in after if (item[0] if isinstance(item, tuple) else item.get("context_id")) == context]
    started = [item for item in received if isinstance(item, dict) and item["type"] == "audio.start"]
    assert len([e for e in started if e["context_id"] == context]) == 1  # the queued sentences were not made
    assert [item["type"] for item in received if isinstance(item, dict)].count("session.ready") == 1


async def test_a_refused_voice_is_an_api_status_error_not_retried(espeak: Server) -> None:
    speaker = TTS(url=espeak.base, api_key=KEY, voice="nobody-by-this-name")
    errors: list[Any] = []
    speaker.on("error", errors.append)
    try:
        with anyio.fail_after(WAIT), pytest.raises(APIStatusError) as caught:
            await drain(speaker.stream(), "Never spoken.")
    finally:
        await speaker.aclose()
    assert caught.value.status_code == 400
    assert caught.value.retryable is False
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "unknown_voice"
    assert [(type(e.error), e.recoverable) for e in errors] == [(APIStatusError, False)]


async def test_a_wrong_key_is_a_401(espeak: Server) -> None:
    speaker = TTS(url=espeak.base, api_key="wrong-key")
    try:
        with anyio.fail_after(WAIT), pytest.raises(APIStatusError) as caught:
            await speaker.synthesize("Never spoken.", conn_options=NO_RETRY).collect()
    finally:
        await speaker.aclose()
    assert caught.value.status_code == 401


async def test_no_server_is_a_connection_error() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, not listening: refused
        speaker = TTS(url=f"http://127.0.0.1:{port}")
        try:
            with anyio.fail_after(WAIT), pytest.raises(APIConnectionError):
                await speaker.synthesize("Never spoken.", conn_options=NO_RETRY).collect()
        finally:
            await speaker.aclose()
