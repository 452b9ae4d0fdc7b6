"""Word timings over the wire, against real ``serve`` processes: the WebSocket route's
``audio.alignment`` (the ``websockets`` client) and the SSE stream's ``speech.audio.alignment``
(httpx).

The fake engine's words are known by construction (``indextts_sidecar.engines.fake.words``:
each whitespace-separated word, its characters' tones); the stand-in IndexTTS (tests/standin)
gives no words, so its segments stand in, with its own upper-cased text and no offsets.
asyncio only: ``websockets``' client and the server (uvicorn) are asyncio libraries.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import httpx
import pytest
from harness import STANDIN
from http_support import TIMEOUT, Server, environ, server, speech
from word_cover import check_every_word_once
from ws_support import session

from indextts_sidecar.engines.fake import words as fake_words

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

Message = Union[dict[str, Any], tuple[str, bytes]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def fake() -> Iterator[Server]:
    with server("--engine", "fake") as running:
        yield running


def expected(text: str, rate: int = 24000) -> list[dict[str, Any]]:
    """The fake engine's words of ``text`` as the events carry them."""
    return [
        {
            "word": text[w.start_char : w.end_char],
            "start": round(w.start / rate, 6),
            "end": round(w.end / rate, 6),
            "char_start": w.start_char,
            "char_end": w.end_char,
        }
        for w in fake_words(text, rate)
    ]


def check_entries(words: list[dict[str, Any]], text: str, seconds: float) -> None:
    """Each entry is the text at its offsets, in order, and lies within the audio; every word of
    ``text`` is in one entry, whole (tests/word_cover.py)."""
    entries = [(w["char_start"], w["char_end"], w["start"], w["end"]) for w in words]
    check_every_word_once(text, entries, seconds)
    for before, after in itertools.pairwise(words):
        assert before["char_end"] <= after["char_start"] and before["start"] <= after["start"]
    for word in words:
        assert text[word["char_start"] : word["char_end"]] == word["word"]
        assert 0 <= word["start"] <= word["end"] <= seconds + 1e-6, (word, seconds)


def per_context(messages: list[Message], context_id: str) -> list[Message]:
    return [
        m
        for m in messages
        if (isinstance(m, tuple) and m[0] == context_id) or (isinstance(m, dict) and m.get("context_id") == context_id)
    ]


def sentences_of(messages: list[Message]) -> list[tuple[dict[str, Any], bytes, dict[str, Any], dict[str, Any]]]:
    """One context's messages as (audio.start, audio, audio.alignment, audio.done) a sentence,
    checking their order: the frames, then the alignment, then at once the done."""
    out = []
    rest = list(messages)
    while not (isinstance(rest[0], dict) and rest[0]["type"] == "context.done"):
        start = rest.pop(0)
        assert isinstance(start, dict) and start["type"] == "audio.start", start
        audio = bytearray()
        while isinstance(rest[0], tuple):
            audio += rest.pop(0)[1]
        alignment, done = rest.pop(0), rest.pop(0)
        assert isinstance(alignment, dict) and alignment["type"] == "audio.alignment", alignment
        assert isinstance(done, dict) and done["type"] == "audio.done", done
        assert alignment["sentence"] == done["sentence"] == start["sentence"]
        out.append((start, bytes(audio), alignment, done))
    assert len(rest) == 1
    return out


async def test_each_sentence_gets_its_words_before_its_done_per_context(fake: Server) -> None:
    texts = {
        "a": "Hello there, friend. How are you today?",
        "b": "Second voice here. It speaks too! Third sentence now.",
    }
    async with session(fake) as ws:
        await ws.send("context.config", context_id="a", options={"chunk_seconds": 0.1})
        await ws.send("context.config", context_id="b", response_format="mp3", options={"chunk_seconds": 0.15})
        # Both contexts' text arrives interleaved, cut mid-word.
        for i in range(0, 60, 6):
            for context_id, text in texts.items():
                if text[i : i + 6]:
                    await ws.send("input.text", context_id=context_id, text=text[i : i + 6])
        await ws.send("input.done", context_id="a")
        await ws.send("input.done", context_id="b")
        messages = await ws.until_done("a", "b")
    assert not [m for m in messages if isinstance(m, dict) and m["type"] == "error"], messages
    # How the two contexts' sentences interleave on the socket is the sidecar's scheduling (seen
    # in one CI run, the contexts switched twice): each context's own sequence is checked below.
    for context_id, text in texts.items():
        spoken = sentences_of(per_context(messages, context_id))
        assert " ".join(start["text"] for start, *_ in spoken) == text
        for start, audio, alignment, done in spoken:
            rate, sentence = start["sample_rate"], start["text"]
            assert alignment == {
                "type": "audio.alignment",
                "context_id": context_id,
                "sentence": start["sentence"],
                "granularity": "word",
                "words": expected(sentence, rate),
            }
            assert [w["word"] for w in alignment["words"]] == sentence.split()
            check_entries(alignment["words"], sentence, done["samples"] / rate)
            if context_id == "a":  # pcm: the frames' bytes are the samples
                assert len(audio) == 2 * done["samples"]


async def test_a_sentence_without_words_still_gets_its_alignment(fake: Server) -> None:
    # ``seconds`` longer than the text's own audio repeats the text: the fake engine names no word.
    async with session(fake) as ws:
        await ws.send("context.config", context_id="z", options={"seconds": 2.0})
        await ws.send("input.text", context_id="z", text="Hello there, friend. How are you today?")
        await ws.send("input.done", context_id="z")
        messages = await ws.until_done("z")
    spoken = sentences_of(messages)
    assert [start["text"] for start, *_ in spoken] == ["Hello there, friend.", "How are you today?"]
    for start, _, alignment, done in spoken:
        assert done["samples"] == 48000
        assert alignment == {
            "type": "audio.alignment",
            "context_id": "z",
            "sentence": start["sentence"],
            "granularity": "word",
            "words": [],
        }


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
    return events


def check_sse_order(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The alignment comes once, after every delta, right before the done; it is returned."""
    kinds = [event["type"] for event in events]
    assert kinds[-2:] == ["speech.audio.alignment", "speech.audio.done"], kinds
    assert kinds.count("speech.audio.alignment") == 1
    return events[-2]


def samples_of(events: list[dict[str, Any]]) -> int:
    return sum(len(base64.b64decode(e["audio"])) for e in events if e["type"] == "speech.audio.delta") // 2


def test_sse_words_are_offsets_into_the_input_and_seconds_of_the_response(fake: Server) -> None:
    text = "One sentence here. And another, longer one follows it."
    events = sse_events(fake, input=text, response_format="pcm", options={"chunk_seconds": 0.2})
    alignment = check_sse_order(events)
    assert alignment == {"type": "speech.audio.alignment", "granularity": "word", "words": expected(text)}
    check_entries(alignment["words"], text, samples_of(events) / 24000)
    # At another rate, the same words at the same seconds (to within a sample of the new rate).
    resampled = check_sse_order(sse_events(fake, input=text, response_format="pcm", sample_rate=16000))
    for got, want in zip(resampled["words"], expected(text), strict=True):
        assert (got["word"], got["char_start"], got["char_end"]) == (want["word"], want["char_start"], want["char_end"])
        assert abs(got["start"] - want["start"]) <= 1 / 16000 + 1e-6


# ------------------------------------------------------------------ IndexTTS: segments


#: The stand-in cuts "a b c d e" two words a segment, 0.1 s a word and 0.1 s of silence after
#: each segment (which is the segment's), at 22,050 Hz; its text is its own, upper-cased.
SEGMENTS = [
    {"word": "A B", "start": 0.0, "end": round(6615 / 22050, 6), "char_start": None, "char_end": None},
    {
        "word": "C D",
        "start": round(6615 / 22050, 6),
        "end": round(13230 / 22050, 6),
        "char_start": None,
        "char_end": None,
    },
    {
        "word": "E",
        "start": round(13230 / 22050, 6),
        "end": round(15435 / 22050, 6),
        "char_start": None,
        "char_end": None,
    },
]
SEGMENTED = {"max_text_tokens_per_segment": 2, "interval_silence": 100}


async def test_indextts_segments_stand_in_over_sse_and_the_websocket(ckpt: Path, voice: str) -> None:
    env = environ(PYTHONPATH=os.pathsep.join([str(STANDIN / "v2"), os.environ.get("PYTHONPATH", "")]))
    args = ("--engine", "indextts2", "-O", f"model_dir={ckpt}", "--voice", f"alloy={voice}")
    with server(*args, env=env) as s:
        events = sse_events(s, input="a b c d e", response_format="pcm", sample_rate=22050, options=SEGMENTED)
        async with session(s) as ws:
            await ws.send("context.config", context_id="c", voice="alloy", sample_rate=22050, options=SEGMENTED)
            await ws.send("input.text", context_id="c", text="a b c d e")
            await ws.send("input.done", context_id="c")
            messages = await ws.until_done("c")
    assert check_sse_order(events) == {"type": "speech.audio.alignment", "granularity": "segment", "words": SEGMENTS}
    assert samples_of(events) == 15435
    [(start, audio, alignment, done)] = sentences_of(messages)
    assert (start["text"], start["sample_rate"], done["samples"], len(audio)) == ("a b c d e", 22050, 15435, 2 * 15435)
    assert alignment == {
        "type": "audio.alignment",
        "context_id": "c",
        "sentence": 0,
        "granularity": "segment",
        "words": SEGMENTS,
    }


# ------------------------------------------------------------------ espeak: its own word events


@pytest.mark.skipif(sys.platform != "linux", reason="the espeak wheel's library is tested on Linux")
async def test_espeak_gives_words_per_sentence_over_the_websocket() -> None:
    pytest.importorskip("espeakng_loader")
    text = 'Good morning, everyone. I am fine; Don\'t pay the 5th bill of 1,234 dollars, "quoted" too!'
    with server("--engine", "espeak") as s:
        async with session(s) as ws:
            await ws.send("context.config", context_id="e", voice="en-us")
            await ws.send("input.text", context_id="e", text=text)
            await ws.send("input.done", context_id="e")
            messages = await ws.until_done("e")
        events = sse_events(s, input=text, voice="en-us", response_format="pcm")  # pcm: 24 kHz
    spoken = sentences_of(messages)
    assert [start["text"] for start, *_ in spoken] == [
        "Good morning, everyone.",
        'I am fine; Don\'t pay the 5th bill of 1,234 dollars, "quoted" too!',
    ]
    words = [[w["word"] for w in alignment["words"]] for _, _, alignment, _ in spoken]
    # "am" gets no event of its own, "Don't" and "5th" only part of one: whole words.
    assert words == [
        ["Good", "morning", "everyone"],
        ["I am", "fine", "Don't", "pay", "the", "5th", "bill", "of", "1,234", "dollars", "quoted", "too"],
    ]
    for start, audio, alignment, done in spoken:
        assert alignment["granularity"] == "word"
        assert len(audio) == 2 * done["samples"]
        check_entries(alignment["words"], start["text"], done["samples"] / start["sample_rate"])
        assert alignment["words"][0]["start"] == 0.0  # seconds from the sentence's own first sample
    # SSE: one request, offsets into the whole input, seconds of the whole response.
    sse = check_sse_order(events)
    assert sse["granularity"] == "word"
    assert [w["word"] for w in sse["words"]] == words[0] + words[1]
    check_entries(sse["words"], text, samples_of(events) / 24000)
