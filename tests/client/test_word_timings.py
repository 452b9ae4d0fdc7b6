"""Word timings on the client: the sidecar's word spans as AudioChunk.words and Audio.words, segment
stand-ins for engines without words, and bad spans from a sidecar dropped, not fatal.

A hand-written sidecar on a socket pair sends exactly the frames each test needs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio
import numpy as np
import pytest
from anyio.abc import SocketStream, TaskGroup
from client_support import RATE, fake_ready, socket_pair

from indextts_client import Audio, Connection, WordTiming
from indextts_client._audio import AudioAssembler, word_timings
from indextts_sidecar import protocol
from indextts_sidecar.protocol import WordSpan
from indextts_sidecar.protocol.framing import FrameReader, FrameWriter

pytestmark = pytest.mark.anyio

Script = Callable[[FrameReader, FrameWriter], Awaitable[None]]
TEXT = "Hello brave world."


def ready(capabilities: Sequence[str]) -> protocol.Ready:
    message = fake_ready()
    message.capabilities = list(capabilities)
    return message


async def scripted_peer(tg: TaskGroup, script: Script) -> SocketStream:
    ours, theirs = await socket_pair()

    async def run() -> None:
        async with theirs:
            await script(FrameReader(theirs), FrameWriter(theirs))

    tg.start_soon(run)
    return ours


async def next_synthesize(reader: FrameReader) -> protocol.Synthesize:
    body = await reader.receive()
    assert body is not None
    request = protocol.decode_request(body)
    assert isinstance(request, protocol.Synthesize)
    return request


def pcm(count: int) -> memoryview:
    return memoryview(np.arange(count, dtype="<i2").tobytes())


#: Three frames of 100, 150 and 50 samples; "Hello" starts in the first, "brave" in the second,
#: "world" only in the done frame (an engine that reports a word after its audio).
WORDS = [WordSpan(0, 5, 0, 90), WordSpan(6, 11, 110, 240), WordSpan(12, 17, 250, 300)]


def words_script(requests: list[protocol.Synthesize], bad: Sequence[WordSpan] = ()) -> Script:
    async def script(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(ready(["word_timings"]))
        while True:
            try:
                request = await next_synthesize(reader)
            except AssertionError:
                return
            requests.append(request)
            i = request.id
            await writer.send(protocol.Audio(id=i, seq=0, sample_rate=RATE, words=[WORDS[0], *bad], pcm=pcm(100)))
            await writer.send(protocol.Audio(id=i, seq=1, sample_rate=RATE, words=[WORDS[1], *bad], pcm=pcm(150)))
            await writer.send(protocol.Audio(id=i, seq=2, sample_rate=RATE, pcm=pcm(50)))
            await writer.send(protocol.Done(id=i, samples=300, chunks=3, sample_rate=RATE, words=[WORDS[2], *bad]))

    return script


EXPECTED = (
    WordTiming("Hello", (0, 5), 0.0, 90 / RATE),
    WordTiming("brave", (6, 11), 110 / RATE, 240 / RATE),
    WordTiming("world", (12, 17), 250 / RATE, 300 / RATE),
)


def check_words(audio: Audio) -> None:
    assert audio.words == EXPECTED
    for word in audio.words:
        assert word.span is not None and TEXT[word.span[0] : word.span[1]] == word.word
        assert 0 <= word.start <= word.end <= audio.duration


async def test_words_arrive_on_their_chunks_and_all_of_them_on_the_audio() -> None:
    requests: list[protocol.Synthesize] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, words_script(requests))
            async with Connection(stream, stream) as conn:
                # synthesize(): the reader assembles the audio, and the words with it.
                check_words(await conn.synthesize(TEXT))
                # An engine with words needs no progress for them: the fast path stays quiet.
                assert requests[-1].progress is False
                async with conn.stream(TEXT) as chunks:
                    got = [chunk async for chunk in chunks]
                    assert chunks.words == EXPECTED
                assert [chunk.words for chunk in got] == [EXPECTED[:1], EXPECTED[1:2], ()]
                async with conn.request(TEXT) as request:
                    check_words(await request.result())


async def test_a_span_outside_the_text_or_backwards_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = [WordSpan(15, 40, 0, 10), WordSpan(3, 2, 0, 10), WordSpan(0, 5, 80, 20), WordSpan(-1, 2, 0, 1)]
    requests: list[protocol.Synthesize] = []
    with anyio.fail_after(10), caplog.at_level(logging.WARNING, logger="indextts_client"):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, words_script(requests, bad))
            async with Connection(stream, stream) as conn:
                audio = await conn.synthesize(TEXT)
                async with conn.stream(TEXT) as chunks:
                    first = await chunks.__anext__()
                    assert first.words == EXPECTED[:1]
    check_words(audio)
    assert len(audio.samples) == 300
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    # Once a request, not once a frame: synthesize() and the stream each said it once.
    assert len(dropped) == 2 and all("dropped 4 of 5 word timings" in m for m in dropped), dropped


def segments_script(requests: list[protocol.Synthesize], announcements: Sequence[str]) -> Script:
    """An engine without word timings: each frame (100 samples) follows a segment's announcement
    when the request asked for progress (as espeak's and IndexTTS's do)."""

    async def script(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(ready([]))
        while True:
            try:
                request = await next_synthesize(reader)
            except AssertionError:
                return
            requests.append(request)
            i = request.id
            for seq, message in enumerate(announcements):
                if request.progress:
                    await writer.send(protocol.Progress(id=i, stage="synthesize", message=message))
                await writer.send(protocol.Audio(id=i, seq=seq, sample_rate=RATE, pcm=pcm(100)))
            count = len(announcements)
            await writer.send(protocol.Done(id=i, samples=100 * count, chunks=count, sample_rate=RATE))

    return script


async def test_segments_stand_in_for_words_where_the_engine_gives_none() -> None:
    requests: list[protocol.Synthesize] = []
    # The fake engine's way: the same span named again goes on with the same segment.
    script = segments_script(requests, ["text[0:11]", "text[0:11]", "text[12:18]"])
    expected = (
        WordTiming("Hello brave", (0, 11), 0.0, 200 / RATE, segment=True),
        WordTiming("world.", (12, 18), 200 / RATE, 300 / RATE, segment=True),
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, script)
            async with Connection(stream, stream) as conn:
                assert (await conn.synthesize(TEXT)).words == expected
                # synthesize() asks for the progress it would skip: the segments come with it.
                assert requests[-1].progress is True
                async with conn.stream(TEXT) as chunks:
                    got = [chunk async for chunk in chunks]
                assert chunks.words == expected
                assert all(chunk.words == () for chunk in got)


async def test_an_engines_own_segment_text_stands_in_without_a_span() -> None:
    requests: list[protocol.Synthesize] = []
    script = segments_script(requests, ["text: HELLO BRAVE", "text: WORLD", "text: WORLD"])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, script)
            async with Connection(stream, stream) as conn:
                audio = await conn.synthesize(TEXT, on_progress=lambda event: None)
    # Each "text: WORDS" starts a segment, even with the words of the one before (IndexTTS's way).
    assert audio.words == (
        WordTiming("HELLO BRAVE", None, 0.0, 100 / RATE, segment=True),
        WordTiming("WORLD", None, 100 / RATE, 200 / RATE, segment=True),
        WordTiming("WORLD", None, 200 / RATE, 300 / RATE, segment=True),
    )


def test_word_timings_are_seconds_and_text_and_a_bad_rate_gives_none() -> None:
    spans = [WordSpan(0, 5, 0, 12000), WordSpan(6, 11, 12000, 24000)]
    assert word_timings(spans, TEXT, 24000) == (
        WordTiming("Hello", (0, 5), 0.0, 0.5),
        WordTiming("brave", (6, 11), 0.5, 1.0),
    )
    assert word_timings(spans, TEXT, 0) == ()


def test_no_words_cost_nothing_per_chunk() -> None:
    assembler = AudioAssembler(1, keep=False, text=TEXT)
    chunk = assembler.add(0, RATE, pcm(10))
    assert chunk.words == () and assembler.words == []
    # No segment announced and no words: nothing stands in.
    assert assembler.all_words(RATE, by_segment=True) == ()


def test_the_hot_path_builder_makes_what_the_constructors_make() -> None:
    # built() writes the fields straight in: the words and the audio a request makes are the
    # constructors' own, and a field added to either and missed where it is used shows here.
    from dataclasses import fields

    from indextts_client._audio import built

    [word] = word_timings([WordSpan(6, 11, 2000, 4000)], TEXT, RATE)
    assert vars(word) == vars(WordTiming("brave", (6, 11), 2000 / RATE, 4000 / RATE))
    assert set(vars(word)) == {field.name for field in fields(WordTiming)}
    samples = np.arange(4, dtype="<i2")
    values = {"samples": samples, "sample_rate": RATE, "timings": {"total": 0.5}, "request_id": 7}
    values |= {"facts": {"voice_cache": "hit"}, "words": (word,)}
    audio = built(Audio, **values)
    assert vars(audio) == vars(Audio(**values)) and set(vars(audio)) == {field.name for field in fields(Audio)}
    with pytest.raises(AttributeError):
        audio.sample_rate = 1  # type: ignore[misc]
