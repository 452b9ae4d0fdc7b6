"""stream_text: fragments in, sentences pipelined on a real fake-engine sidecar, ordered audio out."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, Union

import anyio
import numpy as np
import pytest

from indextts_client import (
    FLUSH,
    BlockingClient,
    Client,
    EngineError,
    Pool,
    SentenceChunk,
    SentenceEnd,
    TextFeed,
    TextStream,
)
from indextts_client._sentences import SentenceSplitter
from indextts_sidecar.engines.fake import render_bytes

pytestmark = pytest.mark.anyio

TIMEOUT = 30
TEXT = "Hello there. How are you today? I am fine, thanks! And you?"
SENTENCES = ["Hello there.", "How are you today?", "I am fine, thanks!", "And you?"]


def split(text: str, size: int) -> list[str]:
    """Fragments of ``size`` characters: cut mid-word and mid-sentence."""
    return [text[i : i + size] for i in range(0, len(text), size)]


async def trickle(pieces: list[Any]) -> AsyncIterator[Any]:
    for piece in pieces:
        await anyio.lowlevel.checkpoint()
        yield piece


def by_sentence(chunks: list[SentenceChunk]) -> dict[int, bytes]:
    out: dict[int, bytearray] = {}
    for chunk in chunks:
        out.setdefault(chunk.sentence, bytearray()).extend(chunk.samples.tobytes())
    return {k: bytes(v) for k, v in out.items()}


async def collect(stream: TextStream, into: list[SentenceChunk]) -> None:
    async with stream:
        async for chunk in stream:
            into.append(chunk)


def check_order(chunks: list[SentenceChunk]) -> None:
    """Sentences in order, each chunk's seq and offset following the one before."""
    seq, offset, sentence = 0, 0, 0
    for chunk in chunks:
        if chunk.sentence != sentence:
            assert chunk.sentence == sentence + 1, chunks
            sentence, seq, offset = chunk.sentence, 0, 0
        assert (chunk.seq, chunk.offset_samples) == (seq, offset), chunk
        seq, offset = seq + 1, offset + len(chunk)


@pytest.mark.parametrize("size", [1, 4, 7])
async def test_fragments_cut_anywhere_come_back_as_exact_sentences_in_order(size: int) -> None:
    with anyio.fail_after(TIMEOUT):
        async with (
            Client("fake", ready_timeout=TIMEOUT) as client,
            client.stream_text(trickle(split(TEXT, size)), chunk_seconds=0.2) as stream,
        ):
            chunks = [chunk async for chunk in stream]
    check_order(chunks)
    assert [chunk.text for chunk in chunks if chunk.seq == 0] == SENTENCES
    assert by_sentence(chunks) == {i: render_bytes(s) for i, s in enumerate(SENTENCES)}
    # The fake engine gives 0.06 s per character at 24 kHz, 0.2 s chunks.
    assert sum(len(c) for c in chunks) == 1440 * sum(len(s) for s in SENTENCES)
    assert max(len(c) for c in chunks) == 4800
    assert {c.sample_rate for c in chunks} == {24000}
    assert stream.sentences == 4


async def test_the_next_sentences_wait_queued_on_the_sidecar_up_to_lookahead() -> None:
    # Each sentence is at least two chunks of 0.2 s compute: the first chunk of sentence 0
    # comes 0.2 s after its request, and the others were sent microseconds after it.
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", ready_timeout=TIMEOUT) as client:
            await client.load()
            async with client.stream_text([TEXT], lookahead=2, delay=0.2) as stream:
                chunks = []
                depths = []
                async for chunk in stream:
                    if chunk.seq == 0:
                        depths.append((chunk.sentence, (await client.ping()).queue_depth))
                    chunks.append(chunk)
    # While sentence N plays, min(2, sentences left after N) more wait on the sidecar.
    assert depths == [(0, 2), (1, 2), (2, 1), (3, 0)]
    assert by_sentence(chunks) == {i: render_bytes(s) for i, s in enumerate(SENTENCES)}


async def test_leaving_mid_sentence_cancels_it_and_the_queued_ones_within_one_chunk() -> None:
    delay = 1.0  # compute per chunk; every sentence below is 5+ chunks
    long = ["A long first sentence that goes on. ", "Then a second one as long as that. ", "A third, just as long."]
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", ready_timeout=TIMEOUT) as client:
            await client.load()
            async with client.stream_text(long, delay=delay) as stream:
                async for chunk in stream:
                    assert (chunk.sentence, chunk.seq) == (0, 0)
                    break
            began = anyio.current_time()
            audio = await client.synthesize("next")
            waited = anyio.current_time() - began
            health = await client.ping()
    # Not behind 4+ chunks of sentence 0 nor 20+ of the two queued: the engine was free
    # within one chunk of the cancel.
    assert audio.timings["queued"] < delay, audio.timings
    assert waited < delay
    assert audio.samples.tobytes() == render_bytes("next")
    assert (health.queue_depth, health.active) == (0, None)


async def test_an_async_generator_left_unfinished_is_closed_at_once() -> None:
    closed: list[str] = []

    async def source() -> AsyncIterator[str]:
        try:
            yield "First sentence. Second"
            await anyio.sleep_forever()  # an LLM that would write on
            yield "never"
        finally:
            closed.append("closed")

    with anyio.fail_after(TIMEOUT):
        async with Client("fake", ready_timeout=TIMEOUT) as client:
            async with client.stream_text(source()) as stream:
                async for chunk in stream:
                    assert chunk.text == "First sentence."
                    break
            assert closed == ["closed"]


async def test_flush_speaks_what_is_left_while_the_text_goes_on() -> None:
    feed = TextFeed()
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", ready_timeout=TIMEOUT) as client, client.stream_text(feed) as stream:
            events = stream.events()
            await feed.send("no sentence e")
            await feed.send("nd here")
            await feed.flush()
            got: list[Union[SentenceChunk, SentenceEnd]] = []
            async for event in events:
                got.append(event)
                if isinstance(event, SentenceEnd):
                    break
            # The feed is still open: only the flush made this sentence speak.
            assert got[-1] == SentenceEnd(0, "no sentence end here", 1440 * 20, flushed=True)
            await feed.send("Cut by its end. Then the rest")
            feed.close()
            async for event in events:
                got.append(event)
    ends = [e for e in got if isinstance(e, SentenceEnd)]
    assert ends == [
        SentenceEnd(0, "no sentence end here", 1440 * 20, flushed=True),
        SentenceEnd(1, "Cut by its end.", 1440 * 15, flushed=False),
        SentenceEnd(2, "Then the rest", 1440 * 13, flushed=True),
    ]
    chunks = [e for e in got if isinstance(e, SentenceChunk)]
    assert by_sentence(chunks) == {e.sentence: render_bytes(e.text) for e in ends}


async def test_text_without_sentence_ends_is_cut_at_spaces_under_the_limit() -> None:
    words = [f"word{i}" for i in range(40)]
    text = " ".join(words)
    with anyio.fail_after(TIMEOUT):
        async with (
            Client("fake", ready_timeout=TIMEOUT) as client,
            client.stream_text(split(text, 5), max_sentence_chars=50) as stream,
        ):
            ends = [e async for e in stream.events() if isinstance(e, SentenceEnd)]
    assert all(len(e.text) <= 50 for e in ends), ends
    assert " ".join(e.text for e in ends).split() == words
    assert sum(e.samples for e in ends) == 1440 * sum(len(e.text) for e in ends)


async def test_forced_cuts_never_glue_words_of_tokens_with_trailing_spaces() -> None:
    # An LLM's tokens: each word with its space after it.  The cut at max_sentence_chars used to
    # strip the held text's trailing space, and the next token was glued to the last word.
    words = [f"w{i}" for i in range(3000)]
    with anyio.fail_after(TIMEOUT):
        async with (
            Client("fake", ready_timeout=TIMEOUT) as client,
            client.stream_text([f"{w} " for w in words], max_sentence_chars=100, seconds=0.01) as stream,
        ):
            ends = [e async for e in stream.events() if isinstance(e, SentenceEnd)]
    assert len(ends) > 100 and all(len(e.text) <= 100 for e in ends)
    assert " ".join(e.text for e in ends).split() == words


async def test_80_kb_of_abbreviations_is_split_off_the_event_loop_in_linear_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: the splitter ran on the loop, rescanning the text per boundary and per forced
    # cut: 80 KB of "A. A. ..." took minutes with the loop blocked.  Timed by the deadline alone.
    threads: list[bool] = []
    add = SentenceSplitter.add

    def recording(self: SentenceSplitter, text: str) -> list[str]:
        threads.append(threading.current_thread() is threading.main_thread())
        return add(self, text)

    monkeypatch.setattr(SentenceSplitter, "add", recording)
    text = "A. " * 27_000
    with anyio.fail_after(TIMEOUT):
        async with (
            Client("fake", ready_timeout=TIMEOUT) as client,
            client.stream_text([text, "Ok."], seconds=0.01) as stream,
        ):
            ends = [e async for e in stream.events() if isinstance(e, SentenceEnd)]
    assert threads == [False, True]  # the big fragment in a worker thread, the token on the loop
    assert all(len(e.text) <= 1000 for e in ends) and len(ends) >= 80
    assert "".join(e.text for e in ends).replace(" ", "") == (text + "Ok.").replace(" ", "")


async def test_an_engine_error_arrives_after_the_audio_before_it() -> None:
    # fail_at=1: one-chunk sentences pass, the two-chunk one fails at its second chunk.
    text = "Short. Also ok. This one is rather long. Never sent."
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", ready_timeout=TIMEOUT) as client:
            got: list[SentenceChunk] = []
            with pytest.raises(EngineError):
                await collect(client.stream_text([text], fail_at=1, chunk_seconds=1.0), got)
            health = await client.ping()
            # The sentence sent ahead was cancelled before this ping was written: it is off the
            # queue.  If the engine had already begun it, it stops at its next chunk, and the
            # ping can come first (the cancel is read at once; the engine thread sees it later).
            assert health.queue_depth == 0
            while health.active is not None:
                health = await client.ping()
    assert [(c.sentence, c.seq) for c in got] == [(0, 0), (1, 0), (2, 0)]
    assert by_sentence(got)[1] == render_bytes("Also ok.")


async def test_an_error_of_the_text_source_arrives_after_the_audio_before_it() -> None:
    async def source() -> AsyncIterator[str]:
        yield "One sentence. And "
        raise ValueError("the LLM stream broke")

    with anyio.fail_after(TIMEOUT):
        async with Client("fake", ready_timeout=TIMEOUT) as client:
            got: list[SentenceChunk] = []
            with pytest.raises(ValueError, match="the LLM stream broke"):
                await collect(client.stream_text(source()), got)
    assert by_sentence(got) == {0: render_bytes("One sentence.")}


async def test_bad_input_is_a_typed_error() -> None:
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", ready_timeout=TIMEOUT) as client:
            with pytest.raises(TypeError, match="not one str"):
                client.stream_text("Hello.")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="lookahead"):
                client.stream_text(["Hello."], lookahead=-1)
            stream = client.stream_text(["Hello."])
            with pytest.raises(RuntimeError, match="async with"):
                stream.__aiter__()
            with pytest.raises(TypeError, match="str or FLUSH"):
                await collect(client.stream_text(["Fine. ", 42]), [])  # type: ignore[list-item]


async def test_a_pool_keeps_one_stream_on_one_member(voice: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", size=2, ready_timeout=TIMEOUT) as pool:
            async with pool.stream_text([TEXT], voice=voice) as first, pool.stream_text([TEXT]) as second:
                a = [c async for c in first]
                during = [h.outstanding for h in await pool.health()]
                b = [c async for c in second]
            after = await pool.health()
    # Each stream is one request in flight on one member, whatever its sentences.
    assert sorted(during) == [1, 1]
    assert sorted(h.served for h in after) == [1, 1]
    assert [h.outstanding for h in after] == [0, 0]
    for chunks in (a, b):
        check_order(chunks)
        assert by_sentence(chunks) == {i: render_bytes(s) for i, s in enumerate(SENTENCES)}


def test_blocking_client_is_a_plain_iterator() -> None:
    def source() -> Iterator[Any]:
        yield from split(TEXT, 3)

    with BlockingClient("fake", ready_timeout=TIMEOUT, timeout=TIMEOUT) as client:
        chunks = list(client.stream_text(source(), chunk_seconds=0.2))
        check_order(chunks)
        assert by_sentence(chunks) == {i: render_bytes(s) for i, s in enumerate(SENTENCES)}
        ends = [e for e in client.stream_text(["Un", "done", FLUSH]).events() if isinstance(e, SentenceEnd)]
        assert ends == [SentenceEnd(0, "Undone", 1440 * 6, flushed=True)]
        with client.stream_text(["A long first sentence. ", "And another."], delay=1.0) as stream:
            for chunk in stream:
                assert chunk.sentence == 0
                break
        audio = client.synthesize("next")
        assert audio.timings["queued"] < 1.0, audio.timings
        health = client.ping()
        assert (health.queue_depth, health.active) == (0, None)
    assert np.array_equal(audio.samples, np.frombuffer(render_bytes("next"), dtype="<i2"))
