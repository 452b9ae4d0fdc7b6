"""``POST /v1/audio/speech`` against a real ``serve`` process: the text each SSE segment event
says its audio speaks (the engines' segment spans), and engine options that would set the
client's own arguments.  The fake engine's spans are known by construction (each character
is ``seconds_per_char`` of one tone); espeak's are its sentences; the stand-in IndexTTS's
are its own words (upper-cased, as upstream's tokenizer does), without offsets."""

from __future__ import annotations

import base64
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import STANDIN
from http_support import TIMEOUT, Server, environ, server, speech

from indextts_sidecar.engines.fake import render_bytes


@pytest.fixture(scope="module")
def fake() -> Iterator[Server]:
    with server("--engine", "fake") as running:
        yield running


def sse_events(s: Server, **body: Any) -> list[dict[str, Any]]:
    events = []
    with (
        httpx.Client(base_url=s.base, timeout=TIMEOUT) as http,
        http.stream("POST", "/v1/audio/speech", json=speech(stream_format="sse", **body)) as answer,
    ):
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
    assert events[-1]["type"] == "speech.audio.done", events[-1]
    return events


def segments(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == "speech.audio.segment"]


def audio(events: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")


def test_each_segment_event_names_the_characters_its_chunk_speaks(fake: Server) -> None:
    # 0.1 s a character (2,400 samples) in chunks of 0.25 s (6,000): two and a half characters
    # a chunk, so a character cut by a chunk's end belongs to both chunks' spans.
    events = sse_events(
        fake,
        input="abcdefgh",
        response_format="pcm",
        options={"seconds_per_char": 0.1, "chunk_seconds": 0.25},
    )
    assert audio(events) == render_bytes("abcdefgh", seconds_per_char=0.1)
    marks = [(e["first_sample"], e["last_sample"], e["text_start"], e["text_end"], e["text"]) for e in segments(events)]
    assert marks == [
        (0, 5999, 0, 3, "abc"),
        (6000, 11999, 2, 5, "cde"),
        (12000, 17999, 5, 8, "fgh"),
        (18000, 19199, 7, 8, "h"),
    ]


def test_a_span_cut_into_frames_gives_its_text_once(fake: Server) -> None:
    # One character of 0.24 s in chunks of 0.02 s: every chunk lies inside the character.
    events = sse_events(
        fake, input="a", response_format="pcm", options={"seconds_per_char": 0.24, "chunk_seconds": 0.02}
    )
    marks = segments(events)
    assert len(marks) == 12
    assert [(e["text_start"], e["text_end"]) for e in marks] == [(0, 1)] * 12
    assert [e.get("text") for e in marks] == ["a"] + [None] * 11


def test_audio_that_is_not_the_texts_own_names_no_text(fake: Server) -> None:
    # ``seconds`` longer than the text's own audio repeats the text: the engine names no span.
    events = sse_events(fake, input="ab", response_format="pcm", options={"seconds": 0.5, "chunk_seconds": 0.1})
    marks = segments(events)
    assert len(marks) == 5
    assert not any({"text", "text_start", "text_end"} & set(e) for e in marks)


@pytest.mark.skipif(sys.platform != "linux", reason="the espeak wheel's library is tested on Linux")
def test_espeak_segments_are_its_sentences() -> None:
    pytest.importorskip("espeakng_loader")
    text = "Hello there.   How are you?\nFine"
    with server("--engine", "espeak") as s:
        # At the engine's own rate (22,050 Hz): no resampler between the engine and its frames.
        events = sse_events(s, input=text, response_format="pcm", sample_rate=22050)
    spoken = [(e["text_start"], e["text_end"], e.get("text")) for e in segments(events)]
    sentences = [(0, 12, "Hello there."), (15, 27, "How are you?"), (28, 32, "Fine")]
    assert [mark for mark in spoken if mark[2] is not None] == sentences
    assert {mark[:2] for mark in spoken} == {(start, end) for start, end, _ in sentences}
    # The segments tile the audio: each starts where the one before it ended.
    marks = segments(events)
    assert marks[0]["first_sample"] == 0
    for before, after in itertools.pairwise(marks):
        assert after["first_sample"] == before["last_sample"] + 1
    assert marks[-1]["last_sample"] + 1 == len(audio(events)) // 2


def test_indextts_segments_carry_the_text_upstream_cut_them_from(ckpt: Path, voice: str) -> None:
    # The stand-in IndexTTS-2 (tests/standin) cuts "a b c d e" into two words a segment and
    # upper-cases, as upstream's tokenizer does: its words are not the input's, so no offsets.
    env = environ(PYTHONPATH=os.pathsep.join([str(STANDIN / "v2"), os.environ.get("PYTHONPATH", "")]))
    args = ("--engine", "indextts2", "-O", f"model_dir={ckpt}", "--voice", f"alloy={voice}")
    with server(*args, env=env) as s:
        events = sse_events(
            s,
            input="a b c d e",
            response_format="pcm",
            sample_rate=22050,
            options={"max_text_tokens_per_segment": 2, "interval_silence": 100},
        )
    marks = [(e["first_sample"], e["last_sample"], e.get("text")) for e in segments(events)]
    # 0.1 s a word; the 0.1 s silence after a segment goes with it.
    assert marks == [
        (0, 4409, "A B"),
        (4410, 6614, None),
        (6615, 11024, "C D"),
        (11025, 13229, None),
        (13230, 15434, "E"),
    ]
    assert not any({"text_start", "text_end"} & set(e) for e in segments(events))
    assert len(audio(events)) // 2 == 15435


@pytest.mark.parametrize("name", ["timeout", "idle_timeout", "voice", "sample_rate", "on_progress"])
def test_options_that_would_set_the_clients_own_arguments_are_refused(fake: Server, name: str) -> None:
    body = speech(input="abcd", response_format="wav", options={name: None})
    answer = httpx.post(fake.base + "/v1/audio/speech", json=body, timeout=TIMEOUT)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["param"], error["message"]) == (f"options.{name}", f"options.{name} is not an engine option")
