"""SSML through real spawned sidecars (the fake engine): each segment its own request, breaks as
exact silences at the output rate, word timings pointing into the SSML source, a plain request
unchanged, and refusals before anything is sent.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from indextts_client import Client, SsmlError
from indextts_sidecar.engines.fake import render
from indextts_sidecar.engines.fake import words as fake_words

pytestmark = pytest.mark.anyio
pytest.importorskip("defusedxml")

TIMEOUT = 60
RATE = 24000
PER_CHAR = 0.06


def fake(**engine: Any) -> Client:
    return Client("fake", engine_options={"seconds_per_char": 0.01, **engine}, timeout=TIMEOUT)


def tones(text: str, rate: int = RATE, per_char: float = 0.01) -> np.ndarray[Any, Any]:
    return render(text, rate, seconds_per_char=per_char)


async def test_breaks_are_exact_silences_between_segments() -> None:
    source = '<speak>Hi there.<break time="250ms"/>Again<break time="1ms"/><break strength="weak"/>end</speak>'
    with anyio.fail_after(TIMEOUT):
        async with fake() as client:
            audio = await client.synthesize(source, text_format="ssml")
    expected = np.concatenate(
        [tones("Hi there."), np.zeros(6000, "<i2"), tones("Again"), np.zeros(24 + 6000, "<i2"), tones("end")]
    )
    assert audio.sample_rate == RATE
    assert audio.samples.tobytes() == expected.tobytes()


async def test_breaks_at_the_asked_rate_within_one_sample() -> None:
    source = '<speak><break time="333ms"/>ab<break time="0.1ms"/>c</speak>'
    with anyio.fail_after(TIMEOUT):
        async with fake() as client:
            audio = await client.synthesize(source, text_format="ssml", sample_rate=22050)
            ab = await client.synthesize("ab", sample_rate=22050)
            c = await client.synthesize("c", sample_rate=22050)
    # 0.333 s at 22,050 Hz is 7342.65 samples: 7343; 0.1 ms is 2.205: 2
    expected = np.concatenate([np.zeros(7343, "<i2"), ab.samples, np.zeros(2, "<i2"), c.samples])
    assert audio.sample_rate == 22050
    assert audio.samples.tobytes() == expected.tobytes()


async def test_plain_text_is_unchanged(tmp_path: Path) -> None:
    text = "Hello <b>world</b> & more"  # markup in plain text is spoken as written
    with anyio.fail_after(TIMEOUT):
        async with fake() as client:
            one = await client.synthesize(text, record=str(tmp_path / "one.json"))
            two = await client.synthesize(text, text_format="text", record=str(tmp_path / "two.json"))
    assert one.samples.tobytes() == two.samples.tobytes() == tones(text).tobytes()
    assert json.loads((tmp_path / "one.json").read_text())["text"] == text
    assert (tmp_path / "one.json").read_text() == (tmp_path / "two.json").read_text().replace("two.json", "one.json")


async def test_renderings_reach_the_engine(tmp_path: Path) -> None:
    source = (
        '<speak>Go <sub alias="World Wide Web">WWW</sub> <say-as interpret-as="cardinal">21</say-as> '
        '<phoneme alphabet="x-arpabet" ph="g ow1">going</phoneme><break time="10ms"/>'
        '<prosody rate="200%">fast</prosody></speak>'
    )
    records = []
    with anyio.fail_after(TIMEOUT):
        async with fake() as client:
            audio = await client.synthesize(source, text_format="ssml", record=str(tmp_path / "r.json"))
            records.append(json.loads((tmp_path / "r.json").read_text()))
    # the last request recorded: the fast segment, at twice the speed (half the seconds per char)
    assert records[-1]["text"] == "fast"
    assert records[-1]["options"]["seconds_per_char"] == pytest.approx(0.03)
    first = "Go World Wide Web twenty-one <going|G OW1>"
    expected = np.concatenate([tones(first), np.zeros(240, "<i2"), tones("fast", per_char=0.03)])
    assert audio.samples.tobytes() == expected.tobytes()


async def test_words_point_into_the_source() -> None:
    source = '<speak>Hello &amp; <s>welcome</s><break time="100ms"/><sub alias="the web">WWW</sub> now</speak>'
    with anyio.fail_after(TIMEOUT):
        async with fake() as client:
            audio = await client.synthesize(source, text_format="ssml")
    got = [(w.word, source[w.span[0] : w.span[1]] if w.span else None) for w in audio.words]
    assert got == [
        ("Hello", "Hello"),
        ("&", "&amp;"),
        ("welcome", "welcome"),
        ("the", '<sub alias="the web">WWW</sub>'),
        ("web", '<sub alias="the web">WWW</sub>'),
        ("now", "now"),
    ]
    # the second segment's words start after the first segment and the break
    first = len(tones("Hello & welcome")) / RATE
    later = next(w for w in audio.words if w.word == "the")
    spoken = fake_words("the web now", RATE, seconds_per_char=0.01)[0]
    assert later.start == pytest.approx(first + 0.1 + spoken.start / RATE)


async def test_refused_before_anything_is_sent(tmp_path: Path) -> None:
    record = tmp_path / "r.json"
    with anyio.fail_after(TIMEOUT):
        async with Client("espeak", timeout=TIMEOUT) as client:
            with pytest.raises(SsmlError) as caught:
                await client.synthesize(
                    '<speak>a<break time="1s"/><phoneme alphabet="pinyin" ph="hang2">b</phoneme></speak>',
                    text_format="ssml",
                )
            assert (caught.value.code, caught.value.tag, caught.value.attribute) == (
                "unsupported",
                "phoneme",
                "alphabet",
            )
            assert (caught.value.line, caught.value.column) == (1, 27)
            health = await client.ping()
            assert health.queue_depth == 0 and health.active is None
    assert not record.exists()


async def test_not_strict_speaks_the_word() -> None:
    ipa = '<speak><phoneme alphabet="ipa" ph="b&#230;&#331;k">bank</phoneme> <audio src="x">ok</audio></speak>'
    pinyin = '<speak><phoneme alphabet="pinyin" ph="hang2">bank</phoneme></speak>'
    with anyio.fail_after(TIMEOUT):
        async with fake() as client:
            with pytest.raises(SsmlError):
                await client.synthesize(ipa, text_format="ssml")
            loose = await client.synthesize(ipa, text_format="ssml", ssml_strict=False)
        async with Client("espeak", timeout=TIMEOUT) as client:
            spoken = await client.synthesize(pinyin, text_format="ssml", ssml_strict=False)
    assert loose.samples.tobytes() == tones("bank ok").tobytes()
    # espeak is not deterministic to the byte: its one word, where the source has it
    assert [(w.word, pinyin[w.span[0] : w.span[1]] if w.span else None) for w in spoken.words] == [("bank", "bank")]


async def test_silence_bound_is_a_parameter() -> None:
    source = '<speak>a<break time="2s"/>b</speak>'
    with anyio.fail_after(TIMEOUT):
        async with fake() as client:
            with pytest.raises(SsmlError, match="more than 1 s"):
                await client.synthesize(source, text_format="ssml", max_silence=1.0)
            with pytest.raises(ValueError, match="text_format"):
                await client.synthesize(source, text_format="html")  # type: ignore[arg-type]


STREAMED = (
    '<speak>One two.<break time="125ms"/><prosody rate="50%">Slow <sub alias="and steady">&amp;</sub></prosody>'
    '<break time="10ms"/>end</speak>'
)


async def test_a_stream_is_the_whole_request_in_chunks() -> None:
    with anyio.fail_after(TIMEOUT):
        async with fake(chunk_seconds=0.05) as client:
            whole = await client.synthesize(STREAMED, text_format="ssml")
            chunks = []
            async with client.stream(STREAMED, text_format="ssml") as stream:
                async for chunk in stream:
                    chunks.append(chunk)
            async with client.request(STREAMED, text_format="ssml") as request:
                kept = await request.result()
    assert [chunk.seq for chunk in chunks] == list(range(len(chunks)))
    offsets = np.cumsum([0] + [len(chunk) for chunk in chunks])
    assert [chunk.offset_samples for chunk in chunks] == list(offsets[:-1])
    joined = np.concatenate([chunk.samples for chunk in chunks])
    assert joined.tobytes() == whole.samples.tobytes() == kept.samples.tobytes()
    silences = [chunk for chunk in chunks if chunk.segment is None]
    assert [len(chunk) for chunk in silences] == [3000, 240]
    assert not any(chunk.samples.any() for chunk in silences)
    # words: carried by the chunks, then all of them on the stream, as synthesize() gives them
    carried = [word for chunk in chunks for word in chunk.words]
    assert [(w.word, w.span, w.start) for w in carried] == [(w.word, w.span, w.start) for w in whole.words]
    assert stream.words == whole.words == kept.words
    spans = [STREAMED[w.span[0] : w.span[1]] for w in whole.words if w.span]
    assert spans == [
        "One",
        "two.",
        "Slow",
        '<sub alias="and steady">&amp;</sub>',
        '<sub alias="and steady">&amp;</sub>',
        "end",
    ]
    # the segments (the fake's: each chunk's characters) are numbered on across requests, and
    # their spans point into the source: the characters as written, or the whole <sub>
    segments = [chunk.segment for chunk in chunks if chunk.segment is not None]
    indices = [segment.index for segment in segments]
    assert indices[0] == 0 and all(b - a in (0, 1) for a, b in itertools.pairwise(indices)) and indices[-1] > 4
    for segment in segments:
        assert segment.span is not None
        written = STREAMED[segment.span[0] : segment.span[1]]
        assert written == segment.text or "<sub" in written, (segment, written)


async def test_leaving_a_stream_early_cancels_it(tmp_path: Path) -> None:
    source = "<speak>" + "long text here " * 200 + '<break time="1s"/>never</speak>'
    record = tmp_path / "r.json"
    with anyio.fail_after(TIMEOUT):
        async with fake(chunk_seconds=0.05) as client:
            async with client.stream(source, text_format="ssml", delay=0.05, record=str(record)) as stream:
                async for _chunk in stream:
                    break
            assert stream.finished
            # the next request is served at once: the first segment was cancelled at a chunk
            # boundary (about 600 chunks of 50 ms compute, 30 s, were left), and the second one never sent
            started = anyio.current_time()
            again = await client.synthesize('<speak>ok<break time="1ms"/></speak>', text_format="ssml")
            assert anyio.current_time() - started < 3
    assert again.samples.tobytes() == np.concatenate([tones("ok"), np.zeros(24, "<i2")]).tobytes()
    assert json.loads(record.read_text())["text"].startswith("long text here")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_blocking_client_speaks_ssml(backend: str) -> None:
    from indextts_client import BlockingClient

    source = '<speak>ab<break time="5ms"/>cd</speak>'
    expected = np.concatenate([tones("ab"), np.zeros(120, "<i2"), tones("cd")]).tobytes()
    options = {"seconds_per_char": 0.01}
    with BlockingClient("fake", engine_options=options, timeout=TIMEOUT, backend=backend) as client:
        assert client.synthesize(source, text_format="ssml").samples.tobytes() == expected
        with client.stream(source, text_format="ssml") as chunks:
            assert np.concatenate([chunk.samples for chunk in chunks]).tobytes() == expected
        assert [w.word for w in chunks.words] == ["ab", "cd"]


async def test_pool_speaks_ssml() -> None:
    from indextts_client import Pool

    source = '<speak>ab<break time="5ms"/>cd</speak>'
    expected = np.concatenate([tones("ab"), np.zeros(120, "<i2"), tones("cd")]).tobytes()
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", size=2, engine_options={"seconds_per_char": 0.01}, timeout=TIMEOUT) as pool:
            assert (await pool.synthesize(source, text_format="ssml")).samples.tobytes() == expected
            async with pool.stream(source, text_format="ssml") as chunks:
                got = [chunk.samples async for chunk in chunks]
            with pytest.raises(SsmlError):
                await pool.synthesize("<speak><audio/></speak>", text_format="ssml")
    assert np.concatenate(got).tobytes() == expected


async def test_stream_text_speaks_ssml_fragments_as_whole_documents() -> None:
    pytest.importorskip("sentence_stream")
    document = '<speak>Hi there. Go <prosody rate="50%">slow. ly</prosody> now. <break time="5ms"/>End</speak>'
    fragments = [document[i : i + 3] for i in range(0, len(document), 3)]
    with anyio.fail_after(TIMEOUT):
        async with fake() as client:
            chunks = []
            async with client.stream_text(fragments, text_format="ssml") as stream:
                async for chunk in stream:
                    chunks.append(chunk)
            texts = list(dict.fromkeys(chunk.text for chunk in chunks))
            assert texts == [
                "<speak>Hi there. </speak>",
                '<speak>Go <prosody rate="50%">slow. ly</prosody> now. </speak>',
                '<speak><break time="5ms"/>End</speak>',
            ]
            whole = [await client.synthesize(text, text_format="ssml") for text in texts]
    got = np.concatenate([chunk.samples for chunk in chunks])
    assert got.tobytes() == np.concatenate([audio.samples for audio in whole]).tobytes()
    for chunk in chunks:  # words point into the document each sentence was sent as
        for word in chunk.words:
            assert word.span is not None and word.word in chunk.text[word.span[0] : word.span[1]]
