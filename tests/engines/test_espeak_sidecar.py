"""The espeak engine behind a real sidecar: its voices, unknown ones refused before queueing,
and its word timings on the audio frames."""

from __future__ import annotations

import re

import anyio
import pytest
from harness import pcm_of, sidecar, spawn

from indextts_client import Client, InvalidRequestError
from indextts_sidecar import protocol

pytest.importorskip("espeakng_loader")
pytestmark = pytest.mark.anyio


async def test_voices_are_listed_without_loading() -> None:
    with anyio.fail_after(30):
        async with Client("espeak") as client:
            voices = await client.voices()
            assert not (await client.ping()).loaded
    assert len(voices) > 100
    english = [v for v in voices if "en-us" in v["languages"]]
    assert [v["name"] for v in english] == ["English (America)"]
    assert english[0]["identifier"] == "gmw/en-US"


async def test_an_unknown_voice_is_refused_before_the_model_loads() -> None:
    with anyio.fail_after(30):
        async with Client("espeak") as client:
            with pytest.raises(InvalidRequestError) as caught:
                await client.synthesize("Hello", voice="no-such-voice")
            assert caught.value.code == "invalid_input" and caught.value.detail["field"] == "voice"
            # Refused by the engine's check on the event loop, not by synthesis: nothing loaded.
            assert not (await client.ping()).loaded
            assert len(await client.synthesize("Hello", voice="en-us+f3")) > 0


async def test_an_unknown_voice_is_refused_at_once_behind_a_running_request() -> None:
    # About 0.6 s of synthesis left after the first chunk; the refusal and the ping take milliseconds.
    long_text = "This sentence keeps the engine busy for a while. " * 200
    with anyio.fail_after(60):
        async with Client("espeak") as client, client.stream(long_text) as running:
            first = await running.__anext__()  # the long request now runs on the engine
            assert first.seq == 0
            with pytest.raises(InvalidRequestError) as caught:
                await client.synthesize("Hello", voice="no-such-voice")
            assert caught.value.code == "invalid_input" and caught.value.detail["field"] == "voice"
            assert "unknown espeak-ng voice 'no-such-voice'" in caught.value.message
            # Refused before queueing: the long request is still running, nothing queued behind it.
            health = await client.ping()
            assert health.active == running.request_id and health.queue_depth == 0


def _words_on_frames(frames: list[protocol.Reply]) -> list[protocol.WordSpan]:
    """The words of one request's frames, each checked to ride on the frame holding its first sample."""
    spoken: list[protocol.WordSpan] = []
    position = 0
    for frame in frames:
        if isinstance(frame, protocol.Audio):
            end = position + len(frame.pcm) // 2
            assert all(position <= word.start < end for word in frame.words), (frame.words, position, end)
            spoken += frame.words
            position = end
    done = frames[-1]
    assert isinstance(done, protocol.Done), done
    return spoken + done.words


async def test_word_timings_reach_the_parent_and_scale_with_the_requested_rate() -> None:
    text = "Grüße, Ωmega café. The quick brown fox jumps over the lazy dog!\nNaïve cats sleep"
    with anyio.fail_after(60):
        async with spawn("espeak") as peer:
            ready = await peer.expect(protocol.Ready)
            assert "word_timings" in ready.capabilities
            native = await peer.request(protocol.Synthesize(id=1, text=text))
            resampled = await peer.request(protocol.Synthesize(id=2, text=text, sample_rate=16000))
    words = _words_on_frames(native)
    assert [text[w.start_char : w.end_char] for w in words] == re.findall(r"\w+", text)
    total = len(pcm_of(native)) // 2
    assert [w.start for w in words] == sorted({w.start for w in words})
    assert all(w.start < w.end <= total for w in words)
    scaled = _words_on_frames(resampled)
    assert [(w.start_char, w.end_char) for w in scaled] == [(w.start_char, w.end_char) for w in words]
    assert all(w.start < w.end <= len(pcm_of(resampled)) // 2 for w in scaled)
    # At 16 kHz: espeak's timing varies by a few native samples from one call to the next
    # (about 15 seen), so within 160 samples (10 ms) of the native positions rescaled.
    # The fake engine's tests check the rescaling exactly.
    for at_16k, at_native in zip(scaled, words, strict=True):
        assert abs(at_16k.start - at_native.start * 16000 / 22050) < 160, (at_16k, at_native)
        assert abs(at_16k.end - at_native.end * 16000 / 22050) < 160, (at_16k, at_native)


async def test_a_cancelled_espeak_request_sends_no_words_past_the_cancel() -> None:
    text = "First sentence is here. " + "Then many more words follow in this one. " * 40
    with anyio.fail_after(60):
        async with sidecar("espeak") as peer:
            await peer.send(protocol.Synthesize(id=1, text=text))
            first = await peer.expect(protocol.Audio)
            await peer.send(protocol.Cancel(id=2, target=1))
            frames = await peer.collect({1, 2})
    rest = frames[1]
    assert isinstance(rest[-1], protocol.Error) and rest[-1].code == "cancelled"
    sent = [*first.words, *(w for f in rest if isinstance(f, protocol.Audio) for w in f.words)]
    assert [text[w.start_char : w.end_char] for w in first.words] == ["First", "sentence", "is", "here"]
    # What follows the cancel (at most the sentences already made) never reaches the end.
    assert len(sent) < len(re.findall(r"\w+", text))
