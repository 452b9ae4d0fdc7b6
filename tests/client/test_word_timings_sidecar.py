"""Word timings through real spawned sidecars: the fake engine's words on Client, Pool,
BlockingClient and stream_text, and IndexTTS's segments standing in for words (the stand-in
upstream of tests/standin, which cuts its own upper-cased words, two a segment here).

Every word is checked against the text it claims to speak and the audio it claims to lie in.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from harness import REPO, STANDIN

from indextts_client import Audio, AudioChunk, Client, WordTiming

pytestmark = pytest.mark.anyio

TIMEOUT = 60
INDEXTTS_RATE = 22050


def check_words(words: Sequence[WordTiming], text: str, samples: int, rate: int) -> None:
    """Each word is the text at its span, in order, and lies within the audio."""
    duration = samples / rate
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
