"""Property tests: messages round-trip; random input never crashes the sidecar.

The sidecar may only leave in two ways here: exit 0 when its input ends cleanly
between frames, or exit 3 after a fatal ``frame_too_large``/``truncated_frame`` error
when framing is lost.  Every frame it writes must decode.
"""

from __future__ import annotations

import itertools
import subprocess

import anyio
import msgspec
from anyio.abc import ByteReceiveStream
from harness import REPO, sidecar_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indextts_sidecar import protocol
from indextts_sidecar.protocol import (
    Audio,
    Cancel,
    Done,
    EmotionAudio,
    EmotionText,
    EmotionVector,
    Error,
    Load,
    Ok,
    Ping,
    Pong,
    Progress,
    Ready,
    Shutdown,
    Synthesize,
    Unload,
    WordSpan,
)
from indextts_sidecar.protocol.framing import FrameReader

ids = st.integers(min_value=0, max_value=2**63 - 1)
floats = st.floats(allow_nan=False, allow_infinity=False)
unit = st.floats(min_value=0, max_value=1)
texts = st.text(max_size=200)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), floats, texts)
option_maps = st.dictionaries(st.text(max_size=20), scalars, max_size=5)
counts = st.integers(0, 2**40)
word_lists = st.lists(st.builds(WordSpan, counts, counts, counts, counts), max_size=6)
emotions = st.one_of(
    st.none(),
    st.builds(EmotionVector, **{name: unit for name in protocol.EMOTION_NAMES}, alpha=unit),
    st.builds(EmotionAudio, path=texts, alpha=unit),
    st.builds(EmotionText, text=st.one_of(st.none(), texts), alpha=unit),
)

requests = st.one_of(
    st.builds(
        Synthesize,
        id=ids,
        text=texts,
        voice=st.one_of(st.none(), texts),
        emotion=emotions,
        sample_rate=st.one_of(st.none(), st.integers(1, 192000)),
        options=option_maps,
    ),
    st.builds(Load, id=ids),
    st.builds(Unload, id=ids),
    st.builds(Ping, id=ids),
    st.builds(Cancel, id=ids, target=ids),
    st.builds(Shutdown, id=ids),
)
replies = st.one_of(
    st.builds(
        Ready,
        protocol=st.integers(0, 100),
        version=texts,
        engine=texts,
        pid=st.integers(1, 2**31),
        max_frame_size=st.integers(1, 2**32),
        sample_rate=st.one_of(st.none(), st.integers(1, 192000)),
        capabilities=st.lists(texts, max_size=4),
        options=option_maps,
        dropped_options=st.lists(texts, max_size=3),
    ),
    st.builds(Progress, id=ids, stage=texts, fraction=st.one_of(st.none(), unit), message=texts),
    st.builds(
        Audio,
        id=ids,
        seq=st.integers(0, 2**32),
        sample_rate=st.integers(1, 192000),
        words=word_lists,
        pcm=st.binary(max_size=512).map(memoryview),
    ),
    st.builds(
        Done,
        id=ids,
        samples=st.integers(0, 2**40),
        chunks=st.integers(0, 2**20),
        sample_rate=st.integers(1, 192000),
        timings=st.dictionaries(texts, floats, max_size=4),
        words=word_lists,
    ),
    st.builds(Ok, id=ids, info=option_maps),
    st.builds(
        Pong,
        id=ids,
        loaded=st.booleans(),
        queue_depth=st.integers(0, 1000),
        active=st.one_of(st.none(), ids),
        memory=st.dictionaries(texts, st.integers(0, 2**50), max_size=3),
        uptime=st.floats(0, 1e9),
    ),
    st.builds(
        Error,
        code=texts,
        message=texts,
        id=st.one_of(st.none(), ids),
        retryable=st.booleans(),
        detail=option_maps,
    ),
)


@given(requests)
def test_every_request_round_trips(message: protocol.Request) -> None:
    data = protocol.frame(message)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert protocol.decode_request(data[4:]) == message


@given(replies)
def test_every_reply_round_trips(message: protocol.Reply) -> None:
    data = protocol.frame(message)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert protocol.decode_reply(data[4:]) == message


@given(replies)
def test_unknown_fields_are_ignored_for_forward_compatibility(message: protocol.Reply) -> None:
    as_map = msgspec.msgpack.decode(protocol.encode(message))
    as_map["field_from_the_future"] = [1, "two"]
    assert protocol.decode_reply(msgspec.msgpack.encode(as_map)) == message


def _frames(output: bytes) -> list[protocol.Reply]:
    frames = []
    view = memoryview(output)
    while view:
        assert len(view) >= 4, "sidecar wrote a partial length prefix"
        size = int.from_bytes(view[:4], "big")
        assert len(view) >= 4 + size, "sidecar wrote a partial frame"
        frames.append(protocol.decode_reply(view[4 : 4 + size]))
        view = view[4 + size :]
    return frames


def _run(stdin: bytes) -> tuple[int, list[protocol.Reply]]:
    result = subprocess.run(
        sidecar_command("fake", "--max-frame-size", "65536", "--frame-timeout", "5"),
        input=stdin,
        capture_output=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    return result.returncode, _frames(result.stdout)


def _check_exit(code: int, frames: list[protocol.Reply]) -> None:
    assert isinstance(frames[0], Ready)
    assert code in (0, 3), f"sidecar died with {code}"
    fatal = [f for f in frames if isinstance(f, Error) and f.code in ("frame_too_large", "truncated_frame")]
    if code == 3:
        assert len(fatal) == 1 and fatal[0].id is None
    else:
        assert not fatal
    terminal_ids = [f.id for f in frames if protocol.is_terminal(f)]
    assert len(terminal_ids) == len(set(terminal_ids)) or any(
        isinstance(f, Error) and f.code == "duplicate_id" for f in frames
    )


_slow = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_slow
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_sidecar(data: bytes) -> None:
    code, frames = _run(data)
    _check_exit(code, frames)


@_slow
@given(st.lists(st.binary(max_size=100), max_size=10))
def test_random_frames_keep_framing_and_get_answers(bodies: list[bytes]) -> None:
    stream = b"".join(len(body).to_bytes(4, "big") + body for body in bodies)
    code, frames = _run(stream + protocol.frame(Ping(id=2**40)))
    _check_exit(code, frames)
    assert code == 0
    # Every random frame was read as one frame: the final ping was still answered.
    assert any(isinstance(f, Pong) and f.id == 2**40 for f in frames)


class _ChunkStream(ByteReceiveStream):
    """Hands out pre-cut chunks, as a pipe might."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._chunks:
            raise anyio.EndOfStream
        return self._chunks.pop(0)

    async def aclose(self) -> None:
        self._chunks = []


@given(st.lists(st.binary(max_size=300), max_size=20), st.lists(st.integers(0, 10_000), max_size=30))
def test_frame_reader_reassembles_frames_however_the_stream_is_cut(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(len(body).to_bytes(4, "big") + body for body in bodies)
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points) if b > a]

    async def read_all() -> list[bytes]:
        reader = FrameReader(_ChunkStream(chunks), max_frame_size=1000)
        received = []
        while (body := await reader.receive()) is not None:
            received.append(bytes(body))
        return received

    assert anyio.run(read_all) == bodies


@given(ids, st.integers(0, 2**32 - 1), st.integers(1, 192000), st.binary(max_size=70000))
def test_audio_frame_parts_decode_to_the_audio_message(request_id: int, seq: int, rate: int, pcm: bytes) -> None:
    head, samples = protocol.audio_frame_parts(request_id, seq, rate, memoryview(pcm))
    data = bytes(head) + bytes(samples)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert protocol.decode_reply(data[4:]) == Audio(id=request_id, seq=seq, sample_rate=rate, pcm=memoryview(pcm))


@given(ids, st.integers(1, 192000), word_lists, st.binary(max_size=70000))
def test_audio_frame_parts_with_words_keep_the_samples_intact(
    request_id: int, rate: int, words: list[WordSpan], pcm: bytes
) -> None:
    head, samples = protocol.audio_frame_parts(request_id, 3, rate, memoryview(pcm), words)
    data = bytes(head) + bytes(samples)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    decoded = protocol.decode_reply(data[4:])
    assert isinstance(decoded, Audio)
    assert decoded.words == words and bytes(decoded.pcm) == pcm
    assert decoded == Audio(id=request_id, seq=3, sample_rate=rate, words=words, pcm=memoryview(pcm))
