"""Word timings over real pipes: the fake engine's words on the audio frames that start them.

The fake engine reports each whitespace-separated word of the text, spoken by its
characters' tones (``indextts_sidecar.engines.fake.words`` computes them); the sidecar
sends each word with the audio frame that holds its first sample (``Audio.words``), at the
frame's sample rate, and those no frame reached with ``done``.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from harness import REPO, Peer, pcm_of, sidecar, spawn

from indextts_sidecar import protocol
from indextts_sidecar._words import WORD_BYTES, PendingWords, frames
from indextts_sidecar.engines import EngineError, Words
from indextts_sidecar.engines.fake import render_bytes, words
from indextts_sidecar.protocol import Audio, Done, Error, WordSpan

pytestmark = pytest.mark.anyio

TIMEOUT = 60
RATE = 8000
PER_CHAR = 0.01
#: 80 samples a character, 160 a chunk (20 ms): a word of 3+ characters spans chunks.
ENGINE = ["-o", f"sample_rate={RATE}", "-o", f"seconds_per_char={PER_CHAR}"]
TEXT = "The  quick brown fox, jumps over\tthe lazy dog."


def _synth(request_id: int, text: str, sample_rate: int | None = None, **options: Any) -> protocol.Synthesize:
    options.setdefault("chunk_seconds", 0.02)
    return protocol.Synthesize(id=request_id, text=text, sample_rate=sample_rate, options=options)


def _expected_words(text: str) -> list[WordSpan]:
    return words(text, RATE, seconds_per_char=PER_CHAR)


def _at_rate(native: Sequence[WordSpan], rate: int) -> list[WordSpan]:
    """``native`` (at the engine's 8 kHz) at ``rate``: rounded down, always."""
    return [WordSpan(w.start_char, w.end_char, w.start * rate // RATE, w.end * rate // RATE) for w in native]


def _check_placement(frames: Sequence[protocol.Reply]) -> list[WordSpan]:
    """Every word rides on the frame that holds its first sample; returns them in order."""
    spoken: list[WordSpan] = []
    position = 0
    for frame in frames:
        if isinstance(frame, Audio):
            end = position + len(frame.pcm) // 2
            for word in frame.words:
                assert position <= word.start < end, (word, position, end)
            spoken += frame.words
            position = end
    return spoken


async def test_each_word_rides_on_the_audio_frame_that_holds_its_first_sample() -> None:
    expected = _expected_words(TEXT)
    assert [TEXT[w.start_char : w.end_char] for w in expected] == TEXT.split()
    assert expected[1] == WordSpan(5, 10, 5 * 80, 10 * 80)  # "quick": after two spaces
    with anyio.fail_after(TIMEOUT):
        async with spawn("fake", *ENGINE) as peer:
            ready = await peer.expect(protocol.Ready)
            assert "word_timings" in ready.capabilities
            frames = await peer.request(_synth(1, TEXT))
            assert pcm_of(frames) == render_bytes(TEXT, RATE, seconds_per_char=PER_CHAR)
            assert _check_placement(frames) == expected
            done = frames[-1]
            assert isinstance(done, Done) and done.words == []
            # Several frames carry none (chunks inside a word): words are not repeated.
            audio = [f for f in frames if isinstance(f, Audio)]
            assert sum(1 for f in audio if not f.words) > 0


async def test_a_chunk_split_into_several_frames_gives_each_word_to_its_own_frame() -> None:
    # One chunk for the whole text; frames of at most 64 KiB less the overhead (32256 samples,
    # 403 characters) at the smallest --max-frame-size: 34 frames of 15 words or so, which
    # their room for 22 words takes.
    text = " ".join(["abcdefghijklmnopqrstuvwxyz"] * 500)
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE, "--max-frame-size", "65536") as peer:
            frames = await peer.request(_synth(1, text, chunk_seconds=1000.0))
            audio = [f for f in frames if isinstance(f, Audio)]
            assert len(audio) == -(-len(text) * 80 // 32256) == 34
            spoken = _check_placement(frames)
            assert spoken == _expected_words(text) and len(spoken) == 500
            assert all(f.words for f in audio)


async def test_a_frame_carries_no_more_words_than_its_size_limit_leaves_room_for() -> None:
    # At the smallest limit (64 KiB) a frame holds 32256 samples and room for 22 words; at
    # 120 samples a character a two-character word takes 240 samples: 134 words a frame
    # unless the sidecar ends frames early.
    text = "a " * 1000
    room = (65536 - (65536 - 1024) - 192) // WORD_BYTES
    assert room == 22
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE, "--max-frame-size", "65536") as peer:
            frames_ = await peer.request(_synth(1, text, chunk_seconds=1000.0, seconds_per_char=0.015))
    audio = [f for f in frames_ if isinstance(f, Audio)]
    assert b"".join(bytes(f.pcm) for f in audio) == render_bytes(text, RATE, seconds_per_char=0.015)
    assert all(len(protocol.frame(f)) - 4 <= 65536 for f in audio)
    assert max(len(f.words) for f in audio) == room
    spoken = _check_placement(frames_)
    assert spoken == words(text, RATE, seconds_per_char=0.015) and len(spoken) == 1000
    # Each frame ends at the first sample of the first word it had no room for.
    assert len(audio) == -(-1000 // room)


async def test_resampled_words_are_at_the_requested_rate() -> None:
    text = "Resample these five words."
    native = _expected_words(text)
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE) as peer:
            for request_id, rate in ((1, 16000), (2, 11025), (3, 4000)):
                frames = await peer.request(_synth(request_id, text, sample_rate=rate))
                done = frames[-1]
                assert isinstance(done, Done) and done.sample_rate == rate, done
                scaled = _at_rate(native, rate)
                spoken = _check_placement(frames) + done.words
                assert spoken == scaled, rate
                assert all(w.start < done.samples and w.end <= done.samples for w in spoken)


async def test_a_cancelled_request_sends_no_more_words() -> None:
    text = "one two three four five six"
    per_chunk = 160
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE) as peer:
            await peer.send(_synth(1, text, hang_at=3))
            received: list[protocol.Reply] = []
            while len([f for f in received if isinstance(f, Audio)]) < 3:
                received.append(await peer.reply())
            await peer.send(protocol.Cancel(id=2, target=1))
            rest = await peer.collect({1, 2})
            frames = received + rest[1]
            terminal = frames[-1]
            assert isinstance(terminal, Error) and terminal.code == "cancelled", terminal
            spoken = _check_placement(frames)
            # The words of the three chunks sent, and not one more.
            assert spoken == [w for w in _expected_words(text) if w.start < 3 * per_chunk]
            assert spoken and len(spoken) < len(text.split())


async def test_a_seconds_shorter_than_the_text_keeps_the_words_it_reaches() -> None:
    text = "alpha beta gamma delta"
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE) as peer:
            frames = await peer.request(_synth(1, text, seconds=0.08))  # 640 samples: 8 characters
            spoken = _check_placement(frames)
            assert spoken == [WordSpan(0, 5, 0, 400), WordSpan(6, 10, 480, 640)]


#: An engine of a third party's (registered through an entry point) that reports words late,
#: out of order, past its audio's end, or broken, as a buggy or unusual engine might.
_ODD_ENGINE = """
import time

from indextts_sidecar.engines import Cancelled, EngineError, Words
from indextts_sidecar.engines.fake import FakeEngine
from indextts_sidecar.protocol import WordSpan

class Odd(FakeEngine):
    name = "odd"

    def synthesize(self, request, progress, cancelled):
        # Two chunks of 160 samples (8 kHz, 20 ms chunks); the text says what to do.
        chunks = [c for c in super().synthesize(request, progress, cancelled) if not isinstance(c, Words)]
        if request.text.startswith("late"):
            yield chunks[0]
            yield chunks[1]
            # After the audio of both, out of order: words that began in the first two chunks.
            yield Words([WordSpan(0, 4, 300, 330), WordSpan(0, 2, 10, 20)])
            yield chunks[2]
            # After the last chunk: a word that starts past the audio's end.
            yield Words([WordSpan(5, 9, 600, 600)])
        elif request.text.startswith("early"):
            # Every word at once, then the first chunk, then a hang until cancelled.
            yield Words([WordSpan(0, 5, 0, 100), WordSpan(6, 9, 150, 200), WordSpan(10, 14, 200, 400)])
            yield chunks[0]
            while not cancelled():
                time.sleep(0.005)
            raise Cancelled
        else:
            yield Words([WordSpan(0, 99, 0, 10)])
            yield chunks[0]
"""


@pytest.fixture
def odd_engine(tmp_path: Path) -> dict[str, str]:
    """The environment under which ``--engine odd`` runs :data:`_ODD_ENGINE`."""
    (tmp_path / "odd_engine").mkdir()
    (tmp_path / "odd_engine" / "__init__.py").write_text(textwrap.dedent(_ODD_ENGINE))
    dist = tmp_path / "odd_engine-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: odd-engine\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[indextts_sidecar.engines]\nodd = odd_engine:Odd\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])}


async def test_words_reported_late_ride_on_the_next_frame_and_those_past_the_audio_on_done(
    odd_engine: dict[str, str],
) -> None:
    with anyio.fail_after(TIMEOUT):
        async with sidecar("odd", *ENGINE, env=odd_engine) as peer:
            frames = await peer.request(_synth(1, "late word"))  # 9 characters: 720 samples, 5 chunks
    audio = [f for f in frames if isinstance(f, Audio)]
    assert [len(f.pcm) // 2 for f in audio] == [160, 160, 160]
    # Words come in order of their first sample, with the first frame after they were reported.
    assert [f.words for f in audio] == [[], [], [WordSpan(0, 2, 10, 20), WordSpan(0, 4, 300, 330)]]
    done = frames[-1]
    assert isinstance(done, Done) and done.samples == 480
    assert done.words == [WordSpan(5, 9, 600, 600)]


async def test_words_held_for_later_frames_are_never_sent_once_the_request_is_cancelled(
    odd_engine: dict[str, str],
) -> None:
    with anyio.fail_after(TIMEOUT):
        async with sidecar("odd", *ENGINE, env=odd_engine) as peer:
            await peer.send(_synth(1, "early one four"))
            first = await peer.expect(Audio)
            # Of the three words the engine gave at once, the two that start in this frame.
            assert first.words == [WordSpan(0, 5, 0, 100), WordSpan(6, 9, 150, 200)]
            await peer.send(protocol.Cancel(id=2, target=1))
            rest = (await peer.collect({1, 2}))[1]
            assert len(rest) == 1 and isinstance(rest[0], Error) and rest[0].code == "cancelled", rest


async def test_a_word_outside_the_text_fails_the_request_as_the_engines_bug(odd_engine: dict[str, str]) -> None:
    with anyio.fail_after(TIMEOUT):
        async with sidecar("odd", *ENGINE, env=odd_engine) as peer:
            frames = await peer.request(_synth(1, "broken"))
            error = frames[-1]
            assert isinstance(error, Error) and error.code == "internal", error
            assert "outside the text" in error.message
            assert not [f for f in frames if isinstance(f, Audio)]
            # The sidecar goes on.
            again = await peer.request(_synth(2, "late word"))
            assert isinstance(again[-1], Done)


# ------------------------------------------------------------------ batches


async def _hold_engine(peer: Peer, request_id: int) -> None:
    """Load the model, then occupy the engine with a request that hangs until cancelled."""
    await peer.request(protocol.Load(id=request_id + 1000))
    await peer.send(_synth(request_id, "held", hang_at=0))
    started = await peer.reply()
    assert isinstance(started, protocol.Progress) and started.id == request_id, started


async def _queued(peer: Peer, ping_id: int) -> None:
    """After this, every request sent before on ``peer`` is queued."""
    await peer.send(protocol.Ping(id=ping_id))
    while not isinstance(reply := await peer.reply(), protocol.Pong):
        assert isinstance(reply, protocol.Progress), reply


async def test_each_request_of_a_batch_gets_its_own_words_at_its_own_rate() -> None:
    texts = {11: "first of the batch", 12: "the second one, resampled", 13: "third"}
    rates = {11: None, 12: 16000, 13: None}
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE, "-o", "max_batch=4") as peer:
            await _hold_engine(peer, 1)
            for request_id, text in texts.items():
                await peer.send(_synth(request_id, text, sample_rate=rates[request_id], hang_at=None))
            await peer.send(_synth(14, "cancelled in the batch", hang_at=2))
            await _queued(peer, 50)
            await peer.send(protocol.Cancel(id=2001, target=1))
            frames = await peer.collect({1, 2001, 11, 12, 13})
            for request_id, text in texts.items():
                rate = rates[request_id] or RATE
                scaled = _at_rate(_expected_words(text), rate)
                done = frames[request_id][-1]
                assert isinstance(done, Done), done
                assert _check_placement(frames[request_id]) + done.words == scaled, request_id
            # The one that hangs inside the batch: its words up to the hang, then none.
            partial: list[protocol.Reply] = frames.get(14, [])
            while len([f for f in partial if isinstance(f, Audio)]) < 2:
                reply = await peer.reply()
                assert getattr(reply, "id", None) == 14, reply
                partial.append(reply)
            await peer.send(protocol.Cancel(id=2002, target=14))
            rest = await peer.collect({14, 2002})
            every = partial + rest[14]
            assert isinstance(every[-1], Error) and every[-1].code == "cancelled"
            assert _check_placement(every) == [w for w in _expected_words("cancelled in the batch") if w.start < 320]


# ------------------------------------------------------------------ in-process


def _word(start: int, end: int | None = None, chars: tuple[int, int] = (0, 1)) -> WordSpan:
    return WordSpan(chars[0], chars[1], start, start if end is None else end)


def test_words_added_out_of_order_leave_in_order_of_their_first_sample() -> None:
    pending = PendingWords(text_length=10)
    pending.add(Words([_word(50), _word(10), _word(30, chars=(2, 3)), _word(30, chars=(4, 5))]))
    assert pending.take(0, 31, limit=10) == ([_word(10), _word(30, chars=(2, 3)), _word(30, chars=(4, 5))], 31)
    assert pending.take(31, 50, limit=10) == ([], 50)  # 50 is not before the frame's end
    assert pending.rest() == [_word(50)] and len(pending) == 0


def test_more_words_than_a_frame_takes_end_it_early_and_none_waits_past_its_first_sample() -> None:
    pending = PendingWords(text_length=10)
    # Five words at sample 0 (an engine that yields them late, or all at one sample), two later.
    pending.add(Words([_word(0)] * 5 + [_word(7), _word(9)]))
    pcm = memoryview(bytes(2 * 20))
    cut = [(len(piece) // 2, len(spoken)) for piece, spoken in frames(pcm, 0, 40, pending, limit=2)]
    # Frames of one sample while the words at 0 drain, then one up to word 9's first sample.
    assert cut == [(1, 2), (1, 2), (7, 2), (11, 1)]
    assert sum(samples for samples, _ in cut) == 20 and len(pending) == 0


@pytest.mark.parametrize(
    "bad",
    [
        WordSpan(0, 11, 0, 1),  # past the text's 10 characters
        WordSpan(3, 2, 0, 1),  # characters backwards
        WordSpan(0, 1, 5, 4),  # ends before it starts
        WordSpan(0, 1, -1, 4),  # before the request's first sample
        WordSpan(0, 1, 0, 2**63),  # too large for a frame's room per word
        (0, 1, 0, 1),  # not a WordSpan
    ],
)
def test_a_bad_word_from_the_engine_is_an_internal_error(bad: Any) -> None:
    with pytest.raises(EngineError) as caught:
        PendingWords(text_length=10).add(Words([bad]))
    assert caught.value.code == "internal"


def test_a_word_encodes_in_word_bytes_at_most() -> None:
    import msgspec

    largest = WordSpan(2**63 - 1, 2**63 - 1, 2**63 - 1, 2**63 - 1)
    assert len(msgspec.msgpack.encode(largest)) == WORD_BYTES
