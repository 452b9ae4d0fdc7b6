"""The transport-agnostic core and the pieces under the client, without spawning children."""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable

import anyio
import numpy as np
import pytest
from anyio.abc import SocketStream, TaskGroup
from client_support import RATE, expected, fake_ready, in_process_sidecar, socket_pair

import indextts_client
from indextts_client import (
    Audio,
    BusyError,
    Client,
    ClosedError,
    Connection,
    CrashedError,
    EngineError,
    InvalidRequestError,
    LoadFailedError,
    ProgressEvent,
    ProtocolError,
    RequestCancelledError,
    RequestTimeoutError,
    RestartLimitError,
    SidecarError,
    StartError,
    TextSegment,
    VersionMismatchError,
)
from indextts_client._audio import AudioAssembler
from indextts_client._exceptions import error_for_frame
from indextts_client._supervision._process import Redactor, StderrLog
from indextts_sidecar import protocol
from indextts_sidecar.protocol.framing import FrameReader, FrameWriter

pytestmark = pytest.mark.anyio

Script = Callable[[FrameReader, FrameWriter], Awaitable[None]]


async def scripted_peer(tg: TaskGroup, script: Script) -> SocketStream:
    """A hand-written sidecar on one end of a socket pair; returns the other end."""
    ours, theirs = await socket_pair()

    async def run() -> None:
        async with theirs:
            await script(FrameReader(theirs), FrameWriter(theirs))

    tg.start_soon(run)
    return ours


async def next_request(reader: FrameReader) -> protocol.Request:
    body = await reader.receive()
    assert body is not None
    return protocol.decode_request(body)


def pcm(*samples: int) -> memoryview:
    return memoryview(np.array(samples, dtype="<i2").tobytes())


# ----------------------------------------------------------------- Connection


async def test_connection_over_an_in_process_server() -> None:
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg, in_process_sidecar(tg) as stream:
            async with Connection(stream, stream) as conn:
                assert conn.info.engine == "fake" and conn.info.sample_rate == RATE
                audio = await conn.synthesize("in process", chunk_seconds=0.02)
                assert audio.samples.tobytes() == expected("in process")
                async with conn.stream("streamed", chunk_seconds=0.02) as stream:
                    chunks = [c async for c in stream]
                assert b"".join(c.samples.tobytes() for c in chunks) == expected("streamed")
                async with conn.stream("endless", seconds=60, chunk_seconds=0.05, delay=0.01) as endless:
                    async for _chunk in endless:
                        break
                assert (await conn.synthesize("after")).samples.tobytes() == expected("after")
                health = await conn.ping()
                assert health.active is None and health.loaded
            assert conn.closed
            with pytest.raises(ClosedError):
                await conn.ping()


async def test_client_connect_over_streams_does_not_respawn() -> None:
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            ours, theirs = await socket_pair()
            closed = anyio.Event()

            async def serve() -> None:
                async with theirs:
                    reader, writer = FrameReader(theirs), FrameWriter(theirs)
                    await writer.send(fake_ready())
                    request = await next_request(reader)
                    assert isinstance(request, protocol.Ping)
                    await writer.send(protocol.Pong(id=request.id, loaded=False, queue_depth=0))
                    await next_request(reader)  # a synthesize: the peer goes away instead
                closed.set()

            tg.start_soon(serve)
            async with Client.connect(ours, ours) as client:
                assert client.info.engine == "fake"
                assert client.pid is None
                assert (await client.ping()).queue_depth == 0
                with pytest.raises(CrashedError) as caught:
                    await client.synthesize("x")
                assert caught.value.exit_code is None
                await closed.wait()
                for _ in range(2):
                    with pytest.raises(CrashedError):
                        await client.ping()
                assert client.restarts == 0


async def test_client_connect_to_an_in_process_server() -> None:
    with anyio.fail_after(20):
        async with (
            anyio.create_task_group() as tg,
            in_process_sidecar(tg) as stream,
            Client.connect(stream, stream) as client,
        ):
            audio = await client.synthesize("connected")
            assert audio.samples.tobytes() == expected("connected")


async def test_seq_gap_is_a_protocol_error_and_the_request_is_cancelled() -> None:
    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(fake_ready())
        request = await next_request(reader)
        await writer.send(protocol.Audio(id=request.id, seq=0, sample_rate=RATE, pcm=pcm(1, 2)))
        await writer.send(protocol.Audio(id=request.id, seq=2, sample_rate=RATE, pcm=pcm(3, 4)))
        cancel = await next_request(reader)
        assert isinstance(cancel, protocol.Cancel) and cancel.target == request.id
        await writer.send(protocol.Error(code="cancelled", id=request.id, message="cancelled"))
        await writer.send(protocol.Ok(id=cancel.id, info={"found": True}))
        ping = await next_request(reader)
        await writer.send(protocol.Pong(id=ping.id, loaded=True, queue_depth=0))
        assert await reader.receive() is None

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            async with Connection(stream, stream) as conn:
                with pytest.raises(ProtocolError, match="seq 2 arrived, expected 1"):
                    await conn.synthesize("x")
                assert (await conn.ping()).loaded
                assert conn.pending == 0


def answer(request_id: int, *samples: int) -> list[bytes]:
    """One audio frame and ``done``, as the parts of one write."""
    return [
        b"".join(protocol.audio_frame_parts(request_id, 0, RATE, pcm(*samples))),
        protocol.frame(protocol.Done(id=request_id, samples=len(samples), chunks=1, sample_rate=RATE)),
    ]


def busy(request_id: int) -> bytes:
    return protocol.frame(protocol.Error(code="busy", id=request_id, retryable=True, message="the queue is full"))


async def test_a_busy_request_with_nothing_left_in_flight_is_sent_again_at_once() -> None:
    """The refusal is read after the client's other request ended: no end is left to wait for.

    With ``pool_timeout`` a refused request waits for another of its client's requests to
    end; here none is left, and it must not sit out ``pool_timeout`` for an end that never
    comes.
    """
    texts: list[str] = []

    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(fake_ready())
        first, second = await next_request(reader), await next_request(reader)
        assert isinstance(first, protocol.Synthesize) and isinstance(second, protocol.Synthesize)
        texts.extend([first.text, second.text])
        # One write: the client reads that the first ended before that the second was refused.
        await writer.send_parts([*answer(first.id, 1, 2), busy(second.id)])
        again = await next_request(reader)
        assert isinstance(again, protocol.Synthesize) and again.text == second.text
        await writer.send_parts(answer(again.id, 3, 4, 5))
        assert await reader.receive() is None

    results: dict[str, list[int]] = {}
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            async with Client.connect(stream, stream, pool_timeout=60) as client:

                async def one(text: str) -> None:
                    results[text] = (await client.synthesize(text)).samples.tolist()

                async with anyio.create_task_group() as requests:
                    requests.start_soon(one, "a")
                    requests.start_soon(one, "b")
    assert results == {texts[0]: [1, 2], texts[1]: [3, 4, 5]}


async def test_a_busy_request_refused_again_and_again_backs_off() -> None:
    """A queue full of other clients' requests (a shared socket sidecar): nothing of this
    client's ends, so it tries again after pauses that grow, not in a loop, until served."""
    tries: list[int] = []

    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(fake_ready())
        count, began = 0, None
        while True:
            request = await next_request(reader)
            assert isinstance(request, protocol.Synthesize) and request.text == "waits"
            count += 1
            began = anyio.current_time() if began is None else began
            if anyio.current_time() - began >= 0.3:
                break
            await writer.send_parts([busy(request.id)])
        tries.append(count)
        await writer.send_parts(answer(request.id, 6, 7))
        assert await reader.receive() is None

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            async with Client.connect(stream, stream, pool_timeout=60) as client:
                assert (await client.synthesize("waits")).samples.tolist() == [6, 7]
    # Pauses of 0, 1, 3, 7, 15, 31, 63 and 100 ms: at most 10 tries fit in 0.3 s (fewer on a
    # slow machine); a loop without pauses makes hundreds.
    assert 3 <= tries[0] <= 20, tries


async def test_done_that_disagrees_with_the_audio_is_a_protocol_error() -> None:
    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(fake_ready())
        request = await next_request(reader)
        await writer.send(protocol.Audio(id=request.id, seq=0, sample_rate=RATE, pcm=pcm(1, 2, 3)))
        await writer.send(protocol.Done(id=request.id, samples=4, chunks=1, sample_rate=RATE))
        request = await next_request(reader)
        await writer.send(protocol.Audio(id=request.id, seq=0, sample_rate=RATE, pcm=pcm(5, 6)))
        await writer.send(protocol.Audio(id=request.id, seq=1, sample_rate=RATE, pcm=pcm(7)))
        await writer.send(protocol.Done(id=request.id, samples=3, chunks=2, sample_rate=RATE))
        assert await reader.receive() is None

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            async with Connection(stream, stream) as conn:
                with pytest.raises(ProtocolError, match="done reports 4 samples in 1 frames, but 3 samples"):
                    await conn.synthesize("x")
                audio = await conn.synthesize("y")
                assert audio.samples.tolist() == [5, 6, 7]


async def test_synthesize_asks_for_progress_only_when_someone_looks() -> None:
    asked: list[bool] = []

    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        ready = fake_ready()
        # An engine with words: it needs no segment announcements (progress) for them; one
        # without is asked for progress (test_word_timings).
        ready.capabilities = [*ready.capabilities, "word_timings"]
        await writer.send(ready)
        while (body := await reader.receive()) is not None:
            request = protocol.decode_request(body)
            assert isinstance(request, protocol.Synthesize)
            asked.append(request.progress)
            await writer.send(protocol.Progress(id=request.id, stage="synthesize", fraction=1.0))
            await writer.send(protocol.Audio(id=request.id, seq=0, sample_rate=RATE, pcm=pcm(1, 2)))
            await writer.send(protocol.Done(id=request.id, samples=2, chunks=1, sample_rate=RATE))

    seen: list[ProgressEvent] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            async with Connection(stream, stream, idle_timeout=300) as conn:
                assert (await conn.synthesize("quiet")).samples.tolist() == [1, 2]
                await conn.synthesize("no idle deadline", idle_timeout=None)
                await conn.synthesize("watched", on_progress=seen.append)
                # A short idle deadline: the sidecar's signs of life after a quiet spell could come late.
                await conn.synthesize("short idle deadline", idle_timeout=5)
                async with conn.stream("streamed") as chunks:
                    assert [c.samples.tolist() async for c in chunks] == [[1, 2]]
                async with conn.request("events") as request:
                    assert [type(e).__name__ async for e in request.events()] == ["ProgressEvent", "AudioChunk"]
    assert asked == [False, False, True, True, True, True]
    assert [e.fraction for e in seen] == [1.0]


async def test_interleaved_replies_are_routed_by_id() -> None:
    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(fake_ready())
        first, second = await next_request(reader), await next_request(reader)
        # Replies in the reverse order, interleaved, plus a frame for an unknown id.
        await writer.send(protocol.Audio(id=second.id, seq=0, sample_rate=RATE, pcm=pcm(20)))
        await writer.send(protocol.Audio(id=first.id, seq=0, sample_rate=RATE, pcm=pcm(10)))
        await writer.send(protocol.Progress(id=999, stage="synthesize"))
        await writer.send(protocol.Audio(id=second.id, seq=1, sample_rate=RATE, pcm=pcm(21)))
        await writer.send(protocol.Done(id=second.id, samples=2, chunks=2, sample_rate=RATE))
        await writer.send(protocol.Done(id=first.id, samples=1, chunks=1, sample_rate=RATE))
        assert await reader.receive() is None

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            async with Connection(stream, stream) as conn:
                first, second = conn.request("a"), conn.request("b")
                await first.start()
                await second.start()
                assert (await second.result()).samples.tolist() == [20, 21]
                assert (await first.result()).samples.tolist() == [10]


async def test_end_of_stream_fails_every_pending_request() -> None:
    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(fake_ready())
        await next_request(reader)
        await next_request(reader)
        await writer.send(protocol.Error(code="truncated_frame", message="stream stalled", detail={"fatal": True}))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            async with Connection(stream, stream) as conn:
                errors: list[BaseException] = []

                async def run(text: str) -> None:
                    try:
                        await conn.synthesize(text)
                    except SidecarError as exc:
                        errors.append(exc)

                async with anyio.create_task_group() as inner:
                    inner.start_soon(run, "a")
                    inner.start_soon(run, "b")
                assert len(errors) == 2
                assert all(isinstance(e, CrashedError) and e.exit_code is None for e in errors)
                assert errors[0] is not errors[1]
                assert "truncated_frame: stream stalled" in str(errors[0])
                with pytest.raises(CrashedError):
                    await conn.ping()


async def test_a_chunks_span_is_the_last_announced_and_other_messages_keep_it() -> None:
    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(fake_ready())
        request = await next_request(reader)
        i = request.id

        def mark(stage: str, message: str) -> protocol.Progress:
            return protocol.Progress(id=i, stage=stage, message=message)

        await writer.send(mark("synthesize", "text[0:5]"))
        await writer.send(protocol.Audio(id=i, seq=0, sample_rate=RATE, pcm=pcm(1)))
        await writer.send(mark("synthesize", "segment 2 ready"))  # a message that names no span
        await writer.send(mark("prepare", "text[9:10]"))  # another stage: not a segment mark
        await writer.send(protocol.Audio(id=i, seq=1, sample_rate=RATE, pcm=pcm(2)))
        await writer.send(mark("synthesize", "text[5:12]"))
        await writer.send(protocol.Audio(id=i, seq=2, sample_rate=RATE, pcm=pcm(3)))
        await writer.send(mark("synthesize", "text: SPANS, SAID BY THE ENGINE"))  # its own words
        await writer.send(protocol.Audio(id=i, seq=3, sample_rate=RATE, pcm=pcm(4)))
        await writer.send(mark("synthesize", "text[12:99]"))  # past the end: cut at the end
        await writer.send(protocol.Audio(id=i, seq=4, sample_rate=RATE, pcm=pcm(5)))
        await writer.send(protocol.Done(id=i, samples=5, chunks=5, sample_rate=RATE))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            async with Connection(stream, stream) as conn, conn.stream("spans, said.") as chunks:
                got = [chunk async for chunk in chunks]
    assert [chunk.text_span for chunk in got] == [(0, 5), (0, 5), (5, 12), None, (12, 12)]
    assert [chunk.segment for chunk in got] == [
        TextSegment(0, "spans", (0, 5)),
        TextSegment(0, "spans", (0, 5)),
        TextSegment(1, ", said.", (5, 12)),
        TextSegment(2, "SPANS, SAID BY THE ENGINE"),
        TextSegment(3, "", (12, 12)),
    ]


async def test_a_stream_that_ends_inside_a_frame_is_a_crash_not_a_protocol_error() -> None:
    # A remote sidecar killed while writing a frame: its socket ends mid-frame.  Before, that was
    # a ProtocolError ("framing lost"), which Pool does not retry on another member.
    audio = protocol.frame(protocol.Audio(id=1, seq=0, sample_rate=RATE, pcm=pcm(*range(100))))
    half = len(audio) // 2
    ours, theirs = await socket_pair()

    async def peer() -> None:
        async with theirs:
            await FrameWriter(theirs).send(fake_ready())
            assert isinstance(await next_request(FrameReader(theirs)), protocol.Synthesize)
            await theirs.send(audio[:half])

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(peer)
            async with Connection(ours, ours, ids=iter([1])) as conn:
                with pytest.raises(CrashedError) as caught:
                    await conn.synthesize("a")
    assert caught.value.exit_code is None and caught.value.signal is None
    assert f"ended inside a frame (stream ended after {half} bytes" in str(caught.value), caught.value


async def test_undecodable_frame_is_fatal() -> None:
    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(fake_ready())
        await next_request(reader)
        await writer.send_parts([b"\x00\x00\x00\x03abc"])
        await reader.receive()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            async with Connection(stream, stream) as conn:
                with pytest.raises(ProtocolError, match="undecodable frame"):
                    await conn.synthesize("x")
                assert isinstance(conn.error, ProtocolError)


@pytest.mark.parametrize(
    ("first_frame", "error", "match"),
    [
        (protocol.frame(fake_ready()).replace(b"\xa8protocol\x01", b"\xa8protocol\x63"), VersionMismatchError, "99"),
        (protocol.frame(protocol.Pong(id=1, loaded=True, queue_depth=0)), StartError, "expected 'ready'"),
        (b"Hello, world\n", StartError, "frame of 1214606444 bytes"),
        (
            protocol.frame(protocol.Error(code="unknown_engine", message="no engine 'x'")),
            StartError,
            "unknown_engine: no engine 'x'",
        ),
    ],
)
async def test_handshake_failures(first_frame: bytes, error: type[StartError], match: str) -> None:
    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send_parts([first_frame])
        await reader.receive()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            with pytest.raises(error, match=match) as caught:
                async with Connection(stream, stream):
                    pass
            if error is VersionMismatchError:
                assert isinstance(caught.value, VersionMismatchError)
                assert (caught.value.expected, caught.value.got) == (1, 99)


async def test_connection_ready_timeout() -> None:
    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await reader.receive()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            with pytest.raises(StartError, match=r"no 'ready' frame within 0\.2 s"):
                async with Connection(stream, stream, ready_timeout=0.2):
                    pass


async def test_connection_idle_timeout_sends_cancel() -> None:
    cancelled = anyio.Event()

    async def peer(reader: FrameReader, writer: FrameWriter) -> None:
        await writer.send(fake_ready())
        request = await next_request(reader)
        await writer.send(protocol.Progress(id=request.id, stage="synthesize", fraction=0.1))
        cancel = await next_request(reader)
        assert isinstance(cancel, protocol.Cancel) and cancel.target == request.id
        cancelled.set()
        await writer.send(protocol.Error(code="cancelled", id=request.id, message="cancelled"))
        await writer.send(protocol.Ok(id=cancel.id))
        await reader.receive()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stream = await scripted_peer(tg, peer)
            async with Connection(stream, stream, idle_timeout=0.2) as conn:
                with pytest.raises(RequestTimeoutError) as caught:
                    await conn.synthesize("x")
                assert caught.value.deadline == "idle_timeout"
                await cancelled.wait()


# ------------------------------------------------------------------ Client misc


async def test_start_and_aclose_from_different_tasks_and_scopes() -> None:
    with anyio.fail_after(20):
        client = Client("fake", engine_options={"sample_rate": RATE, "seconds_per_char": 0.01})
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.start)
        with anyio.fail_after(10):  # a scope opened after start() and closed before aclose()
            assert (await client.synthesize("x")).samples.tobytes() == expected("x")
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.aclose)
        assert client.closed


def test_client_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="python or command"):
        Client(python="python3", command=["python3"])
    with pytest.raises(ValueError, match="max_restarts"):
        Client(max_restarts=-1)
    client = Client("fake", engine_options={"model_dir": "/m", "fp16": True, "n": 3}, sidecar_args=["--max-queue", "9"])
    assert client.argv[-10:] == [
        "--engine",
        "fake",
        "-o",
        'model_dir="/m"',
        "-o",
        "fp16=true",
        "-o",
        "n=3",
        "--max-queue",
        "9",
    ]
    with pytest.raises(RuntimeError):
        _ = client.info


# --------------------------------------------------------------------- pieces


def test_assembler_single_writable_frame_is_not_copied() -> None:
    body = bytearray(np.arange(5, dtype="<i2").tobytes())
    assembler = AudioAssembler(1, keep=True)
    chunk = assembler.add(0, RATE, memoryview(body))
    assert not chunk.samples.flags.writeable
    assembler.check_done(5, 1, RATE)
    samples = assembler.assemble()
    assert samples.tolist() == [0, 1, 2, 3, 4]
    assert np.shares_memory(samples, np.frombuffer(body, dtype=np.uint8))
    samples[0] = 99  # writable, and the frame's own memory
    assert body[:2] == (99).to_bytes(2, "little")


def test_assembler_copies_frames_once_into_one_array() -> None:
    frames = [np.arange(i * 10, i * 10 + 10, dtype="<i2").tobytes() for i in range(3)]
    assembler = AudioAssembler(1, keep=True)
    for seq, frame in enumerate(frames):
        assembler.add(seq, RATE, memoryview(frame))
    assembler.check_done(30, 3, RATE)
    samples = assembler.assemble()
    assert samples.tolist() == list(range(30))
    assert samples.flags.writeable
    assert assembler.assemble().size == 0  # it handed its buffer over and holds nothing more


def test_assembler_grows_in_place_and_keeps_no_frame() -> None:
    assembler = AudioAssembler(1, keep=True)
    expected: list[int] = []
    first = bytearray()
    for seq in range(200):
        frame = bytearray(np.full(seq + 1, seq, dtype="<i2").tobytes())
        expected.extend([seq] * (seq + 1))
        assembler.add(seq, RATE, memoryview(frame))
        # From the second frame on, every frame (the first one too, then) is copied and dropped:
        # overwriting the caller's bytes no longer changes the audio.
        if seq == 0:
            first = frame
        else:
            frame[:] = bytes(len(frame))
            first[:] = bytes(len(first))
    assembler.check_done(len(expected), 200, RATE)
    samples = assembler.assemble()
    assert samples.tolist() == expected
    # A view of the bytearray the frames were appended to, with its growth room (an eighth at
    # most) instead of a shrinking realloc.
    assert isinstance(samples.base, memoryview)
    base = samples.base.obj
    assert isinstance(base, bytearray) and len(base) == len(expected) * 2
    allocated = sys.getsizeof(base) - sys.getsizeof(bytearray())
    assert len(base) <= allocated <= len(base) * 9 // 8 + 8


def test_assembler_checks() -> None:
    with pytest.raises(ProtocolError, match="expected 0"):
        AudioAssembler(1, keep=False).add(1, RATE, pcm(1))
    with pytest.raises(ProtocolError, match="not whole int16 samples"):
        AudioAssembler(1, keep=False).add(0, RATE, memoryview(b"\x00\x00\x00"))
    assembler = AudioAssembler(1, keep=False)
    assembler.add(0, RATE, pcm(1))
    with pytest.raises(ProtocolError, match="Hz"):
        assembler.add(1, RATE * 2, pcm(1))
    with pytest.raises(ProtocolError, match="done reports"):
        assembler.check_done(1, 2, RATE)
    empty = AudioAssembler(2, keep=True)
    empty.check_done(0, 0, RATE)
    assert len(empty.assemble()) == 0


def test_audio_helpers() -> None:
    audio = Audio(np.array([-32768, 0, 16384, 32767], dtype="<i2"), 4, {"total": 1.0}, 7)
    assert len(audio) == 4 and audio.duration == 1.0
    assert audio.as_float32().tolist() == [-1.0, 0.0, 0.5, 32767 / 32768]
    assert "request_id=7" in repr(audio)


def test_redactor() -> None:
    redact = Redactor(
        {
            "HF_TOKEN": "tok-123456",
            "api_key": "key-abcdef",
            "DB_PASSWORD": "pw-9999",
            "SHORT_KEY": "ab",
            "HOME": "/root",
        },
        extra=["extra-secret"],
    )
    hf = "hf_" + "x" * 34
    text = f"a {hf} b tok-123456 c key-abcdef d pw-9999 e ab f /root g extra-secret"
    assert redact(text) == "a *** b *** c *** d *** e ab f /root g ***"
    assert redact("hf_short") == "hf_short"


def test_stderr_log_lines_levels_tail_and_redaction(caplog: pytest.LogCaptureFixture) -> None:
    log = StderrLog(Redactor({"MY_TOKEN": "sekret-value"}), tail_lines=4, tail_chars=1000)
    with caplog.at_level(logging.DEBUG, logger="indextts_client.sidecar"):
        log.feed(b"plain line\n2026-01-01 10:00:00,123 ERROR indextts_sidecar[1]: it broke sek")
        log.feed(b"ret-value\nTraceback (most recent call last):\n  File x\nValueError: bad\nafter\n")
        log.feed(b"x" * 10_000)
        log.flush()
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert records[0] == (logging.INFO, "plain line")
    assert records[1] == (logging.ERROR, "2026-01-01 10:00:00,123 ERROR indextts_sidecar[1]: it broke ***")
    assert [level for level, _ in records[2:5]] == [logging.ERROR] * 3  # the traceback
    assert records[5] == (logging.INFO, "after")
    assert [len(message) for _, message in records[6:]] == [4096, 4096, 1808]
    tail = log.tail()
    assert tail.count("\n") <= 3 and len(tail) <= 1000
    assert tail.endswith("x" * 100)
    assert "sekret-value" not in "".join(message for _, message in records)


def test_stderr_log_prefers_cutting_long_lines_at_spaces() -> None:
    log = StderrLog(Redactor({"A_SECRET": "0123456789abcdef"}), max_line=100, tail_lines=100)
    log.feed(("word " * 18 + "0123456789abcdef " + "y" * 200).encode())
    log.flush()
    assert "0123456789abcdef" not in log.tail()
    assert "***" in log.tail()


def test_errors_for_frames() -> None:
    kwargs = {"request_id": 3, "retryable": False, "detail": {"field": "$.x"}}
    assert type(error_for_frame("busy", "full", **kwargs)) is BusyError
    assert type(error_for_frame("load_failed", "x", **kwargs)) is LoadFailedError
    for code in ("invalid_option", "unknown_option", "invalid_input", "invalid_message"):
        error = error_for_frame(code, "bad", **kwargs)
        assert type(error) is InvalidRequestError
        assert isinstance(error, EngineError) and error.code == code and error.detail == {"field": "$.x"}
    for code in ("cancelled", "shutting_down"):
        cancelled = error_for_frame(code, "stop", **kwargs)
        assert type(cancelled) is RequestCancelledError and cancelled.code == code
    assert type(error_for_frame("engine_error", "boom", **kwargs)) is EngineError
    assert type(error_for_frame("something_new", "?", **kwargs)) is EngineError


def test_exception_hierarchy_and_public_names() -> None:
    flat = [
        StartError,
        CrashedError,
        RestartLimitError,
        RequestTimeoutError,
        RequestCancelledError,
        EngineError,
        ProtocolError,
        ClosedError,
    ]
    for cls in flat:
        assert cls.__bases__[0] is SidecarError
    assert issubclass(RequestTimeoutError, TimeoutError)
    assert issubclass(VersionMismatchError, StartError)
    for cls in (BusyError, LoadFailedError, InvalidRequestError):
        assert cls.__bases__ == (EngineError,)
    timeout = RequestTimeoutError("late", deadline="idle_timeout", seconds=2.0, request_id=4)
    assert str(timeout) == "late" and timeout.request_id == 4
    for name in indextts_client.__all__:
        assert hasattr(indextts_client, name), name
    assert indextts_client.__version__
    assert indextts_client.EmotionVector is protocol.EmotionVector
