"""Word timings of an SSML text over the wire, against a real ``serve`` process: the SSE
stream's ``speech.audio.alignment`` (httpx) and the WebSocket route's ``audio.alignment``
(``websockets``).  Every entry's offsets point into the SSML source as the client sent it (SSE:
the request's ``input``; the WebSocket: the sentence's document as ``audio.start`` gives it):
``source[char_start:char_end]`` is the word, or, for a word the source does not hold (a
``sub``'s alias, ``say-as`` digits read out), the whole element; in order, after the break's
silence where one comes between.  The fake engine's words are known by construction."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("defusedxml")

from http_support import TIMEOUT, Server, server, speech

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

SUB = '<sub alias="doctor who">Dr.</sub>'
DIGITS = '<say-as interpret-as="digits">42</say-as>'
SSML = (
    '<speak><s>Good <prosody rate="fast">morning</prosody> friend.</s> <break time="200ms"/>'
    f"Call {SUB} Smith now. {DIGITS} end</speak>"
)
#: (the word spoken, what its offsets cover in the source)
WORDS = [
    ("Good", "Good"),
    ("morning", "morning"),
    ("friend.", "friend."),
    ("Call", "Call"),
    ("doctor", SUB),
    ("who", SUB),
    ("Smith", "Smith"),
    ("now.", "now."),
    ("four", DIGITS),
    ("two", DIGITS),
    ("end", "end"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # websockets' client and uvicorn are asyncio's


@pytest.fixture(scope="module")
def fake() -> Iterator[Server]:
    with server("--engine", "fake") as running:
        yield running


def check(words: list[dict[str, Any]], source: str) -> list[tuple[str, str]]:
    """Each entry's offsets in ``source``, in order (an element's words share its span); the
    (word, covered text) pairs."""
    for before, after in itertools.pairwise(words):
        assert before["start"] <= after["start"], (before, after)
        same = (before["char_start"], before["char_end"]) == (after["char_start"], after["char_end"])
        assert same or before["char_end"] <= after["char_start"], (before, after)
    covered = []
    for word in words:
        start, end = word["char_start"], word["char_end"]
        assert isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(source), word
        covered.append((word["word"], source[start:end]))
    return covered


def test_sse_offsets_point_into_the_ssml_input(fake: Server) -> None:
    body = speech(stream_format="sse", input=SSML, response_format="pcm", text_format="ssml")
    with (
        httpx.Client(base_url=fake.base, timeout=TIMEOUT) as http,
        http.stream("POST", "/v1/audio/speech", json=body) as answer,
    ):
        assert answer.status_code == 200, answer.read()
        events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: ")]
    [alignment] = [e for e in events if e["type"] == "speech.audio.alignment"]
    assert alignment["granularity"] == "word"
    words = alignment["words"]
    assert check(words, SSML) == WORDS
    friend, call = words[2], words[3]
    assert call["start"] - friend["end"] >= 0.2  # the break's silence lies between them


async def test_websocket_offsets_point_into_each_sentences_document(fake: Server) -> None:
    pytest.importorskip("websockets")
    from ws_support import session

    async with session(fake) as ws:
        await ws.send("context.config", context_id="s", text_format="ssml")
        for i in range(0, len(SSML), 7):  # tags cut across messages
            await ws.send("input.text", context_id="s", text=SSML[i : i + 7])
        await ws.send("input.done", context_id="s")
        messages = [m for m in await ws.until_done("s") if isinstance(m, dict)]
    assert messages[-1] == {"type": "context.done", "context_id": "s"}, messages
    texts = {m["sentence"]: m["text"] for m in messages if m["type"] == "audio.start"}
    alignments = [m for m in messages if m["type"] == "audio.alignment"]
    assert [a["sentence"] for a in alignments] == sorted(texts) == list(range(len(texts)))
    # Each sentence is one whole document, the input's <speak> around it; cut after each sentence end.
    assert list(texts.values()) == [
        '<speak><s>Good <prosody rate="fast">morning</prosody> friend.</s></speak>',
        f'<speak> <break time="200ms"/>Call {SUB} Smith now. </speak>',
        f"<speak>{DIGITS} end</speak>",
    ]
    covered = [pair for a in alignments for pair in check(a["words"], texts[a["sentence"]])]
    assert covered == WORDS
    call = alignments[1]["words"][0]
    assert call["word"] == "Call" and call["start"] >= 0.2  # after the break that opens its sentence
