"""Word timings through real spawned sidecars: the fake engine's words on Client, Pool,
BlockingClient and stream_text, and IndexTTS's segments standing in for words (the stand-in
upstream of tests/standin, which cuts its own upper-cased words, two a segment here).

Every word is checked against the text it claims to speak and the audio it claims to lie in.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from harness import REPO, STANDIN
from word_cover import check_every_word_once

from indextts_client import Audio, AudioChunk, BlockingClient, Client, Pool, SentenceChunk, SentenceEnd, WordTiming
from indextts_sidecar.engines.fake import words as fake_words

pytestmark = pytest.mark.anyio

TIMEOUT = 60
INDEXTTS_RATE = 22050


def check_words(words: Sequence[WordTiming], text: str, samples: int, rate: int) -> None:
    """Each word is the text at its span, in order, and lies within the audio; every word of
    ``text`` is in one entry, whole (tests/word_cover.py)."""
    duration = samples / rate
    entries = [(*word.span, word.start, word.end) for word in words if word.span is not None]
    check_every_word_once(text, entries, duration, slack=1e-9)
    end_char = 0
    for word in words:
        assert word.span is not None
        start, end = word.span
        assert text[start:end] == word.word and word.word.strip() == word.word and word.word
        assert start >= end_char, words  # in order, no overlap
        end_char = end
        assert 0 <= word.start <= word.end <= duration + 1e-9, (word, duration)
        assert not word.segment


# ------------------------------------------------------------------ IndexTTS: segments stand in


def indextts(ckpt: Path) -> Client:
    env = {"PYTHONPATH": os.pathsep.join([str(STANDIN / "v2"), REPO])}
    return Client("indextts2", engine_options={"model_dir": str(ckpt)}, env=env)


#: "a b c d e", two words a segment, 0.1 s a word, 0.1 s of silence after each segment (which
#: belongs to it): the stand-in's segments, in samples at its 22,050 Hz.
SEGMENTS = (
    WordTiming("A B", None, 0.0, 6615 / INDEXTTS_RATE, segment=True),
    WordTiming("C D", None, 6615 / INDEXTTS_RATE, 13230 / INDEXTTS_RATE, segment=True),
    WordTiming("E", None, 13230 / INDEXTTS_RATE, 15435 / INDEXTTS_RATE, segment=True),
)
OPTIONS: dict[str, Any] = {"max_text_tokens_per_segment": 2, "interval_silence": 100}


async def test_indextts_segments_stand_in_for_words(ckpt: Path, voice: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with indextts(ckpt) as client:
            assert "word_timings" not in client.info.capabilities
            # synthesize()'s fast path asks for no progress: it must still learn the segments.
            audio = await client.synthesize("a b c d e", voice=voice, **OPTIONS)
            async with client.stream("a b c d e", voice=voice, **OPTIONS) as chunks:
                got: list[AudioChunk] = [chunk async for chunk in chunks]
            streamed = chunks.words
    assert len(audio) == 15435
    assert audio.words == SEGMENTS
    assert streamed == SEGMENTS
    # A segment's end is known only when the next starts: no stand-in rides on a chunk.
    assert all(chunk.words == () for chunk in got)


async def test_one_segment_stands_in_to_the_end_of_the_audio(ckpt: Path, voice: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with indextts(ckpt) as client:
            audio: Audio = await client.synthesize("a", voice=voice, interval_silence=0)
    assert [(w.word, w.span, w.start, w.segment) for w in audio.words] == [("A", None, 0.0, True)]
    assert audio.words[0].end == audio.duration


# ------------------------------------------------------------------ the fake engine: words

TEXT = "Hello there, brave new world. How are you today?"
#: 0.1 s a character in chunks of 0.25 s: words cross chunk boundaries.
FAKE_OPTIONS: dict[str, Any] = {"seconds_per_char": 0.1, "chunk_seconds": 0.25}


def expected_words(text: str) -> tuple[WordTiming, ...]:
    """What the fake engine says: each whitespace-separated word, 0.1 s a character."""
    return tuple(
        WordTiming(text[s.start_char : s.end_char], (s.start_char, s.end_char), s.start / 24000, s.end / 24000)
        for s in fake_words(text, 24000, seconds_per_char=0.1)
    )


def check_chunks(chunks: Sequence[AudioChunk], words: Sequence[WordTiming]) -> None:
    """Each word rides on the chunk that holds its first sample, once."""
    carried = [word for chunk in chunks for word in chunk.words]
    assert tuple(carried) == tuple(words)
    for chunk in chunks:
        for word in chunk.words:
            first = round(word.start * chunk.sample_rate)
            assert chunk.offset_samples <= first <= chunk.last_sample, (word, chunk)


async def test_fake_words_on_client_chunks_and_audio() -> None:
    expected = expected_words(TEXT)
    assert [w.word for w in expected] == TEXT.split()
    with anyio.fail_after(TIMEOUT):
        async with Client("fake") as client:
            assert "word_timings" in client.info.capabilities
            audio = await client.synthesize(TEXT, **FAKE_OPTIONS)
            async with client.stream(TEXT, **FAKE_OPTIONS) as stream:
                chunks = [chunk async for chunk in stream]
            # Resampled: the same words, at the same seconds to within a sample of the new rate.
            resampled = await client.synthesize(TEXT, sample_rate=16000, **FAKE_OPTIONS)
    assert audio.words == expected
    check_words(audio.words, TEXT, len(audio), audio.sample_rate)
    assert stream.words == expected
    check_chunks(chunks, expected)
    assert [w.span for w in resampled.words] == [w.span for w in expected]
    for got, want in zip(resampled.words, expected, strict=True):
        assert abs(got.start - want.start) <= 1 / 16000 and abs(got.end - want.end) <= 1 / 16000
    check_words(resampled.words, TEXT, len(resampled), resampled.sample_rate)


async def test_fake_words_through_a_pool() -> None:
    expected = expected_words(TEXT)
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", size=2) as pool:
            audio = await pool.synthesize(TEXT, **FAKE_OPTIONS)
            async with pool.stream(TEXT, **FAKE_OPTIONS) as stream:
                chunks = [chunk async for chunk in stream]
    assert audio.words == expected
    assert stream.words == expected
    check_chunks(chunks, expected)


def test_fake_words_through_a_blocking_client() -> None:
    expected = expected_words(TEXT)
    with BlockingClient("fake", ready_timeout=TIMEOUT, timeout=TIMEOUT) as client:
        audio = client.synthesize(TEXT, **FAKE_OPTIONS)
        with client.stream(TEXT, **FAKE_OPTIONS) as stream:
            chunks = list(stream)
    assert audio.words == expected
    assert stream.words == expected
    check_chunks(chunks, expected)


async def test_stream_text_gives_each_sentence_its_words() -> None:
    sentences = ["Hello there, brave new world.", "How are you today?"]
    pieces = [TEXT[i : i + 7] for i in range(0, len(TEXT), 7)]  # cut mid-word
    chunks: list[SentenceChunk] = []
    ends: list[SentenceEnd] = []
    with anyio.fail_after(TIMEOUT):
        async with Client("fake") as client, client.stream_text(pieces, **FAKE_OPTIONS) as stream:
            async for item in stream.events():
                if isinstance(item, SentenceChunk):
                    chunks.append(item)
                else:
                    ends.append(item)
    assert [end.text for end in ends] == sentences
    for end in ends:
        # Seconds from the sentence's first sample, spans into the sentence's own text.
        assert end.words == expected_words(end.text)
        check_words(end.words, end.text, end.samples, 24000)
        mine = [chunk for chunk in chunks if chunk.sentence == end.sentence]
        assert tuple(word for chunk in mine for word in chunk.words) == end.words
        for chunk in mine:
            for word in chunk.words:
                first = round(word.start * chunk.sample_rate)
                assert chunk.offset_samples <= first < chunk.offset_samples + len(chunk.samples)


# ------------------------------------------------------------------ espeak: espeak-ng's word events

#: "am" and "the" get no event of their own (joined to the word before), "Don't" and "5th"
#: only part of one, "1,234" several.
ESPEAK_TEXT = 'Hello there, brave world. I am fine; Don\'t pay the 5th bill of 1,234 dollars, "quoted" too!'


@pytest.mark.skipif(sys.platform != "linux", reason="the espeak wheel's library is tested on Linux")
async def test_espeak_words_are_its_own_word_events() -> None:
    pytest.importorskip("espeakng_loader")
    with anyio.fail_after(TIMEOUT):
        async with Client("espeak") as client:
            assert "word_timings" in client.info.capabilities
            audio = await client.synthesize(ESPEAK_TEXT)
            async with client.stream(ESPEAK_TEXT) as stream:
                chunks = [chunk async for chunk in stream]
            resampled = await client.synthesize(ESPEAK_TEXT, sample_rate=16000)
    spoken = ["Hello", "there", "brave", "world", "I am", "fine", "Don't", "pay", "the", "5th", "bill", "of", "1,234"]
    spoken += ["dollars", "quoted", "too"]
    assert [word.word for word in audio.words] == spoken
    check_words(audio.words, ESPEAK_TEXT, len(audio), audio.sample_rate)
    # The words fill the audio from its start, one after the other.
    assert audio.words[0].start == 0.0
    assert all(a.end <= b.start for a, b in itertools.pairwise(audio.words))
    # espeak-ng's timing of a word may differ by a few samples from one run to the next: each
    # request is checked on its own, and against the others by its words.
    for words, samples, rate in (
        (stream.words, sum(len(c) for c in chunks), 22050),
        (resampled.words, len(resampled), 16000),
    ):
        assert [(word.word, word.span) for word in words] == [(word.word, word.span) for word in audio.words]
        check_words(words, ESPEAK_TEXT, samples, rate)
    check_chunks(chunks, stream.words)


def test_every_engine_that_declares_word_timings_is_checked_here() -> None:
    # The invariant (tests/word_cover.py) is checked above on the client, and in
    # tests/serving/test_word_alignment.py on the WebSocket route and SSE, for these engines:
    # a new engine with word timings fails this until it is checked there too.
    from indextts_sidecar.engines import engine_class, engine_names

    timed = {name for name in engine_names() if "word_timings" in engine_class(name).capabilities}
    assert timed == {"fake", "espeak"}
