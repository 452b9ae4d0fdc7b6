"""The segment spans the fake and espeak engines announce (``text[START:END]`` in the
``synthesize`` progress before a segment's audio), called in-process."""

from __future__ import annotations

import itertools
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from indextts_sidecar.engines import SynthesisRequest, Words
from indextts_sidecar.engines.espeak import sentence_spans, split_sentences
from indextts_sidecar.engines.fake import FakeEngine, FakeOptions, FakeRequestOptions, render
from indextts_sidecar.protocol.segments import segment_message, segment_span

#: split_sentences as it was written before it was built on sentence_spans.
_BREAK = re.compile(r"(?<=[.!?;])\s+|\s*\n\s*")


def _old_split(text: str) -> list[str]:
    return [s for s in (p.strip() for p in _BREAK.split(text)) if s]


def test_a_message_names_a_span_and_only_that() -> None:
    assert segment_message(3, 17) == "text[3:17]"
    assert segment_span("text[3:17]") == (3, 17)
    assert segment_span("text[0:0]") == (0, 0)
    for other in ("", "done", "text[5:2]", "text[1:2] and more", "segment 2 ready", "text[-1:2]", "text[1:x]"):
        assert segment_span(other) is None, other
    with pytest.raises(ValueError, match="start <= end"):
        segment_message(5, 2)


@given(st.text(alphabet=st.sampled_from("ab .!?;\n\t,"), max_size=60))
def test_sentence_spans_are_where_split_sentences_finds_its_sentences(text: str) -> None:
    spans = sentence_spans(text)
    assert [text[start:end] for start, end in spans] == _old_split(text) == split_sentences(text)
    assert all(start < end for start, end in spans)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # in order, apart


def _fake_marks(text: str, **options: Any) -> list[tuple[str, Any, bytes]]:
    """What the fake engine sends, in order: ("progress", message) and ("audio", bytes)."""
    engine = FakeEngine(FakeOptions())
    engine.load(lambda *a, **k: None, lambda: False)
    got: list[Any] = []
    request = SynthesisRequest(
        id=1, text=text, voice=None, emotion=None, options=msgspec.convert(options, FakeRequestOptions)
    )

    def progress(stage: str, fraction: Any = None, message: str = "") -> None:
        got.append(("progress", stage, message))

    for chunk in engine.synthesize(request, progress, lambda: False):
        if isinstance(chunk, Words):
            got.append(("words", "", chunk.words))
        else:
            got.append(("audio", "", bytes(memoryview(chunk).cast("B"))))
    return got


def test_the_fake_engine_names_each_chunks_characters_before_it() -> None:
    # 2,400 samples a character, 6,000 a chunk.
    got = _fake_marks("abcdefgh", seconds_per_char=0.1, chunk_seconds=0.25)
    assert [(kind, stage, message) for kind, stage, message in got if kind == "progress"] == [
        ("progress", "synthesize", "text[0:3]"),
        ("progress", "synthesize", "text[2:5]"),
        ("progress", "synthesize", "text[5:8]"),
        ("progress", "synthesize", "text[7:8]"),
    ]
    # The one word before the chunk that holds its first sample (tests/sidecar/test_words.py).
    assert [kind for kind, _, _ in got] == ["words"] + ["progress", "audio"] * 4
    assert (
        b"".join(data for kind, _, data in got if kind == "audio") == render("abcdefgh", seconds_per_char=0.1).tobytes()
    )


def test_the_fake_engine_names_no_span_for_audio_that_repeats_the_text() -> None:
    got = _fake_marks("ab", seconds=0.5, chunk_seconds=0.1)
    assert [message for kind, _, message in got if kind == "progress"] == [""] * 5
    shorter = _fake_marks("abcd", seconds=0.1, chunk_seconds=0.05)  # cut short: still the text's own
    assert [message for kind, _, message in shorter if kind == "progress"] == ["text[0:1]", "text[0:2]"]
