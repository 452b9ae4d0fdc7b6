"""The WebSocket route's server events (indextts_client/_socket_events.py): the JSON the route
writes, field for field as it was when it built dicts, and what a client decoding them gets."""

from __future__ import annotations

import json

import pytest

from indextts_client._socket_events import (
    AlignedWord,
    AudioAlignment,
    AudioDone,
    AudioStart,
    ContextCancelled,
    ContextDone,
    MalformedEvent,
    ServerError,
    SessionReady,
    decode_server_event,
    encode_event,
)
from indextts_client.integrations._socket import Timeline

WORDS = [AlignedWord("Hello", 0.0, 0.3, 0, 5), AlignedWord("there", 0.36, 0.6, None, None)]
EVENTS = [
    (SessionReady(), {"type": "session.ready"}),
    (ServerError(code="busy", message="later"), {"type": "error", "code": "busy", "message": "later"}),
    (
        ServerError(code="invalid_request_error", message="m", param="speed", context_id="c"),
        {"type": "error", "code": "invalid_request_error", "message": "m", "param": "speed", "context_id": "c"},
    ),
    (ContextDone(context_id="c"), {"type": "context.done", "context_id": "c"}),
    (ContextCancelled(context_id="c"), {"type": "context.cancelled", "context_id": "c"}),
    (
        AudioStart(context_id="c", sentence=1, text="Hi.", response_format="wav", sample_rate=24000),
        {"type": "audio.start", "context_id": "c", "sentence": 1, "text": "Hi.", "response_format": "wav",
         "sample_rate": 24000},
    ),
    (
        AudioAlignment(context_id="c", sentence=1, granularity="word", words=WORDS),
        {"type": "audio.alignment", "context_id": "c", "sentence": 1, "granularity": "word", "words": [
            {"word": "Hello", "start": 0.0, "end": 0.3, "char_start": 0, "char_end": 5},
            {"word": "there", "start": 0.36, "end": 0.6, "char_start": None, "char_end": None},
        ]},
    ),
    (
        AudioDone(context_id="c", sentence=1, samples=480, bytes=960, flushed=True),
        {"type": "audio.done", "context_id": "c", "sentence": 1, "samples": 480, "bytes": 960, "flushed": True},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("event", "wire"), EVENTS)
def test_each_event_is_the_routes_json_and_decodes_back(event: object, wire: dict[str, object]) -> None:
    text = encode_event(event)  # type: ignore[arg-type]
    assert text == json.dumps(wire, separators=(",", ":"))  # the same keys, in the same order
    assert decode_server_event(text) == event


def test_a_client_skips_a_type_it_does_not_know_and_fills_what_an_event_leaves_out() -> None:
    assert decode_server_event('{"type": "audio.new", "context_id": "c"}') is None
    start = decode_server_event('{"type": "audio.start", "context_id": "c", "sentence": 0, "text": "Hi."}')
    assert start == AudioStart(context_id="c", sentence=0, text="Hi.", response_format="pcm", sample_rate=0)


@pytest.mark.parametrize(
    ("text", "context_id", "message"),
    [
        ("not json", None, "one JSON object"),
        ("[1, 2]", None, "one JSON object"),
        ('{"type": "context.done"}', None, "context.done: Object missing required field `context_id`"),
        (
            '{"type": "audio.alignment", "context_id": "c", "words": [{"word": "a", "start": "soon", "end": 1}]}',
            "c",
            "a word's time is not a number of seconds",
        ),
        (
            '{"type": "audio.alignment", "context_id": "c", "words": [{"word": "a", "start": 0, "end": 1e9}]}',
            "c",
            "a word's time is not a number of seconds",
        ),
        ('{"type": "audio.done", "context_id": "c", "flushed": "yes"}', "c", "audio.done: Expected `bool`"),
    ],
)
def test_a_malformed_event_is_refused_naming_its_context(text: str, context_id: object, message: str) -> None:
    with pytest.raises(MalformedEvent, match=message) as refused:
        decode_server_event(text)
    assert refused.value.context_id == context_id


def test_a_timeline_places_a_sentences_words_from_the_turns_first_sample() -> None:
    timeline = Timeline(sample_rate=24000)
    timeline.add_audio(48000)  # one second of the first sentence
    timeline.start_sentence(AudioStart(context_id="c", sample_rate=0))  # 0: the rate stands
    segment = AudioAlignment(context_id="c", granularity="segment", words=[AlignedWord("Hello there", 0.5, 0.9)])
    assert timeline.words(segment) == [("Hello", 1.5, 1.9), ("there", 1.5, 1.9)]
    words = timeline.words(AudioAlignment(context_id="c", words=WORDS))
    assert [w for w, _, _ in words] == ["Hello", "there"]
    assert [t for _, *times in words for t in times] == pytest.approx([1.0, 1.3, 1.36, 1.6])
