"""A short first segment (``first_segment_tokens``), cut by upstream's own segmenter, without torch.

The segmenters here are shaped like upstream's: IndexTTS-2's ``tokenizer.split_segments(pieces,
max_tokens, quick_streaming_tokens=...)`` cuts sentencepiece pieces at punctuation within the
budget, else by length (mid-word too, with a warning); 2.5's ``split_text_by_tokens(text,
max_tokens, lang_prefix)`` cuts text at punctuation, else by characters.  The real ones run in
tests/upstream/test_upstream_joining.py.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from indextts_support import loaded_engine, make_request, never

from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine
from indextts_sidecar.engines.indextts._segments import STREAM_FIRST_SEGMENT_TOKENS, SegmentTexts, first_length
from indextts_sidecar.protocol.segments import read_segment

MARK = "\u2581"


def split_pieces(pieces: list[str], max_tokens: int, quick_streaming_tokens: int = 0) -> list[list[str]]:
    segments: list[list[str]] = []
    current: list[str] = []
    for piece in pieces:
        current.append(piece)
        if piece in (".", ",") and len(current) <= max_tokens:
            segments.append(current)
            current = []
        elif len(current) == max_tokens and max_tokens < len(pieces):
            warnings.warn("cut by length", RuntimeWarning, stacklevel=1)
            segments.append(current)
            current = []
    return [*segments, current] if current else segments


class Tokenizer:
    def __init__(self) -> None:
        self.split_segments = split_pieces


class Model2:
    def __init__(self) -> None:
        self.tokenizer = Tokenizer()


class Model25:
    def split_text_by_tokens(self, text: str, max_tokens: int, lang_prefix: str = "") -> list[str]:
        assert lang_prefix == "<en>"
        if len(text) <= max_tokens:
            return [text]
        return [text[i : i + max_tokens] for i in range(0, len(text), max_tokens)]  # one token a character


PIECES = [f"{MARK}HEL", "LO", f"{MARK}THERE", f"{MARK}MY", f"{MARK}FRIE", "ND", f"{MARK}HOW", "."]


def test_the_first_segment_is_cut_at_a_word_boundary_and_the_rest_stays_one_segment() -> None:
    model = Model2()
    texts = SegmentTexts()
    assert texts.install(model)
    texts.start(first_tokens=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the segmenter's own warning for the cut is not passed on
        segments = model.tokenizer.split_segments(PIECES, 120, quick_streaming_tokens=0)
    # Five pieces end inside "FRIEND": the cut moves back to the word's start.
    assert segments == [PIECES[:4], PIECES[4:]]
    assert texts.texts == ["HELLO THERE MY", "FRIEND HOW."]
    texts.start()  # the next request, without the option: upstream's segments unchanged
    assert model.tokenizer.split_segments(PIECES, 120) == [PIECES]


def test_a_first_segment_no_longer_than_asked_or_without_a_word_boundary_stays_whole() -> None:
    model = Model2()
    texts = SegmentTexts()
    texts.install(model)
    texts.start(first_tokens=20)
    assert model.tokenizer.split_segments(PIECES, 120) == [PIECES]
    texts.start(first_tokens=1)  # the cut would fall inside the first word, with nothing before it
    assert model.tokenizer.split_segments(PIECES, 120) == [PIECES]


def test_text_segments_are_cut_between_words_and_join_back_to_the_text() -> None:
    model = Model25()
    texts = SegmentTexts()
    texts.install(model)
    texts.start(first_tokens=9)
    text = "Hello there my friend. How are you."
    segments = model.split_text_by_tokens(text, 120, "<en>")
    assert segments == ["Hello ", "there my friend. How are you."]  # 9 ends in "there": moved back
    assert "".join(segments) == text
    texts.start(first_tokens=0)
    assert model.split_text_by_tokens(text, 120, "<en>") == [text]


def test_first_segment_tokens_is_a_request_option_with_an_engine_default() -> None:
    for cls in (IndexTTS2Engine, IndexTTS25Engine):
        engine = msgspec.convert({"first_segment_tokens": 12}, cls.Options)
        assert first_length(msgspec.convert({}, cls.RequestOptions), engine) == 12
        assert first_length(msgspec.convert({"first_segment_tokens": 0}, cls.RequestOptions), engine) is None
        assert first_length(msgspec.convert({"first_segment_tokens": 5}, cls.RequestOptions), engine) == 5
        plain = msgspec.convert({}, cls.Options)
        assert first_length(msgspec.convert({}, cls.RequestOptions), plain) is None


def test_a_streaming_request_gets_a_short_first_segment_unless_an_option_says_otherwise() -> None:
    for cls in (IndexTTS2Engine, IndexTTS25Engine):
        plain = msgspec.convert({}, cls.Options)
        unset = msgspec.convert({}, cls.RequestOptions)
        assert first_length(unset, plain, stream=True) == STREAM_FIRST_SEGMENT_TOKENS == 10
        assert first_length(unset, plain, stream=False) is None  # a whole request: upstream's segments
        off = msgspec.convert({"first_segment_tokens": 0}, cls.RequestOptions)
        assert first_length(off, plain, stream=True) is None
        own = msgspec.convert({"first_segment_tokens": 4}, cls.RequestOptions)
        assert first_length(own, plain, stream=True) == 4
        engine_off = msgspec.convert({"first_segment_tokens": 0}, cls.Options)
        assert first_length(unset, engine_off, stream=True) is None
        engine_set = msgspec.convert({"first_segment_tokens": 7}, cls.Options)
        assert first_length(unset, engine_set, stream=True) == 7


@pytest.mark.parametrize("flavour", ["v2", "v25"])
def test_the_adapter_cuts_a_streaming_requests_first_segment_by_default_and_no_other(
    flavour: str, ckpt: Path, ckpt25: Path, voice: str, standin: Callable[[str], None]
) -> None:
    """Through synthesize() on the stand-ins (a text token a word): a streaming request's first
    segment ends after STREAM_FIRST_SEGMENT_TOKENS words; a whole one, or a stream with an explicit
    0, keeps upstream's one segment."""
    standin(flavour)
    cls = IndexTTS25Engine if flavour == "v25" else IndexTTS2Engine
    engine = loaded_engine(cls, ckpt25 if flavour == "v25" else ckpt)
    words = [f"w{i}" for i in range(14)]
    text = " ".join(words)

    def said(stream: bool, **options: Any) -> list[str]:
        events: list[tuple[Any, ...]] = []
        request = dataclasses.replace(make_request(cls, voice, text=text, **options), stream=stream)
        list(engine.synthesize(request, lambda *a: events.append(a), never))
        return [str(read_segment(e[2])).lower() for e in events if e[2].startswith("text:")]

    first = " ".join(words[:STREAM_FIRST_SEGMENT_TOKENS])
    assert said(True) == [first, " ".join(words[STREAM_FIRST_SEGMENT_TOKENS:])]
    assert said(False) == [text]
    assert said(True, first_segment_tokens=0) == [text]
    assert said(True, first_segment_tokens=3) == [" ".join(words[:3]), " ".join(words[3:])]
