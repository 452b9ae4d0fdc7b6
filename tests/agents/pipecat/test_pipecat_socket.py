"""indextts_client.integrations._socket: the route's events as the services send and read them
(framework-free; here because the services are its callers)."""

from __future__ import annotations

import json

import pytest

from indextts_client._socket_events import AudioAlignment, AudioStart, decode_server_event
from indextts_client.integrations._socket import Timeline, event, split_frame, stream_url


def start(rate: int) -> AudioStart:
    """An ``audio.start`` as the service decodes it."""
    decoded = decode_server_event(json.dumps({"type": "audio.start", "context_id": "c", "sample_rate": rate}))
    assert isinstance(decoded, AudioStart)
    return decoded


def alignment(granularity: str, words: list[dict[str, object]]) -> AudioAlignment:
    """An ``audio.alignment`` as the service decodes it."""
    fields = {"type": "audio.alignment", "context_id": "c", "granularity": granularity, "words": words}
    decoded = decode_server_event(json.dumps(fields))
    assert isinstance(decoded, AudioAlignment)
    return decoded


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/v1/audio/speech/stream"),
        ("https://tts.example/", "wss://tts.example/v1/audio/speech/stream"),
        ("ws://h:1", "ws://h:1/v1/audio/speech/stream"),
        ("wss://h/v1/audio/speech/stream", "wss://h/v1/audio/speech/stream"),
        ("https://proxy.example/tts/stream", "wss://proxy.example/tts/stream"),  # a proxy's path is kept
    ],
)
def test_the_route_url_from_a_base(base: str, url: str) -> None:
    assert stream_url(base) == url


def test_a_url_of_another_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="ftp://h"):
        stream_url("ftp://h")


def test_events_leave_out_what_is_none() -> None:
    assert json.loads(event("session.config", voice=None, sample_rate=24000)) == {
        "type": "session.config",
        "sample_rate": 24000,
    }


def test_a_binary_frame_splits_into_its_context_and_audio() -> None:
    assert split_frame(b"\x03abc\x01\x02") == ("abc", b"\x01\x02")
    assert split_frame(b"\x01a") == ("a", b"")
    with pytest.raises(ValueError, match="empty"):
        split_frame(b"")
    with pytest.raises(ValueError, match="shorter"):
        split_frame(b"\x05ab")


def test_words_are_placed_on_the_turns_timeline() -> None:
    timeline = Timeline(sample_rate=24000)
    timeline.start_sentence(start(24000))
    timeline.add_audio(2 * 36000)  # sentence 0: 1.5 s
    first = alignment("word", [{"word": "Hi.", "start": 0.0, "end": 0.3}])
    assert timeline.words(first) == [("Hi.", 0.0, 0.3)]
    timeline.start_sentence(start(24000))
    timeline.add_audio(2 * 12000)
    second = alignment("word", [{"word": "Bye", "start": 0.1, "end": 0.4}, {"word": "", "start": 0.4, "end": 0.5}])
    assert timeline.words(second) == [("Bye", 1.6, 1.9)]  # 1.5 s of sentence 0 before it; no empty word


def test_segment_stand_ins_give_their_words_at_the_segments_start() -> None:
    timeline = Timeline(sample_rate=22050)
    timeline.start_sentence(start(22050))
    segment = alignment("segment", [{"word": "One two  three.", "start": 0.0, "end": 2.0}])
    assert timeline.words(segment) == [("One", 0.0, 2.0), ("two", 0.0, 2.0), ("three.", 0.0, 2.0)]
