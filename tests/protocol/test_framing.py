"""FrameReader over a real pipe: receive() and pump() cut the stream into the same frames.

The pipe is read with :class:`FdReceiveStream`, whose ``when_readable`` runs the pump from
the event loop's readiness callback on asyncio and from a task elsewhere: both backends.
"""

from __future__ import annotations

import os
import random

import anyio
import pytest

from indextts_sidecar import protocol
from indextts_sidecar.protocol.framing import FrameReader, FrameSplitter, FrameTooLarge, TruncatedFrame
from indextts_sidecar.protocol.streams import FdReceiveStream, FdSendStream

pytestmark = pytest.mark.anyio

TIMEOUT = 30


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(protocol.HEADER, "big") + body


def _bodies(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    sizes = [0, 1, 3, 4, 5, 300, 65536, 300_000, 1_000_000] + [rng.randrange(0, 5000) for _ in range(40)]
    rng.shuffle(sizes)
    return [bytes([index % 251]) * size for index, size in enumerate(sizes)]


async def _write_cut(send: FdSendStream, data: bytes, seed: int) -> None:
    """Write ``data`` in pieces cut at random points, so frames straddle reads."""
    rng = random.Random(seed)
    position = 0
    async with send:
        while position < len(data):
            size = rng.choice([1, 2, 3, 7, 100, 4096, 70_000, 300_000])
            await send.send(data[position : position + size])
            position += size


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_pump_over_a_pipe_hands_out_every_frame_whole_and_in_order(seed: int) -> None:
    bodies = _bodies(seed)
    read_fd, write_fd = os.pipe()
    received: list[bytes] = []

    def on_frame(body: memoryview) -> bool:
        received.append(bytes(body))
        return False

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_write_cut, FdSendStream(write_fd), b"".join(map(_frame, bodies)), seed)
            async with FdReceiveStream(read_fd) as stream:
                reader = FrameReader(stream, max_frame_size=2_000_000, frame_timeout=10)
                assert await reader.pump(on_frame) is False  # the end of the stream, between frames
    assert received == bodies


async def test_pump_stops_when_asked_and_keeps_the_rest_for_receive() -> None:
    bodies = [b"a", b"bb", b"stop", b"ccc", b"dddd"]
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"".join(map(_frame, bodies)))  # all in one read
    os.close(write_fd)
    seen: list[bytes] = []

    def on_frame(body: memoryview) -> bool:
        seen.append(bytes(body))
        return bytes(body) == b"stop"

    with anyio.fail_after(TIMEOUT):
        async with FdReceiveStream(read_fd) as stream:
            reader = FrameReader(stream)
            assert await reader.pump(on_frame) is True
            assert seen == [b"a", b"bb", b"stop"]
            assert [bytes(await reader.receive() or b"?") for _ in range(2)] == [b"ccc", b"dddd"]
            assert await reader.receive() is None


async def test_a_frame_left_by_a_stopped_pump_survives_the_reads_after_it() -> None:
    # pump() reads into one buffer again and again; a frame it leaves for later is copied out first.
    read_fd, write_fd = os.pipe()
    os.write(write_fd, _frame(b"stop") + _frame(b"kept" * 100))
    later: list[bytes] = []

    def collect(body: memoryview) -> bool:
        later.append(bytes(body))
        return False

    with anyio.fail_after(TIMEOUT):
        async with FdReceiveStream(read_fd) as stream:
            reader = FrameReader(stream)
            assert await reader.pump(lambda body: bytes(body) == b"stop") is True
            kept = await reader.receive()
            assert kept is not None
            os.write(write_fd, _frame(b"x" * 1000))
            os.close(write_fd)
            assert await reader.pump(collect) is False
    assert later == [b"x" * 1000]
    assert bytes(kept) == b"kept" * 100


async def test_frames_before_an_oversized_prefix_are_handed_out_first() -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, _frame(b"first") + _frame(b"second") + (10**6).to_bytes(4, "big") + b"junk")
    seen: list[bytes] = []

    def on_frame(body: memoryview) -> bool:
        seen.append(bytes(body))
        return False

    with anyio.fail_after(TIMEOUT):
        async with FdReceiveStream(read_fd) as stream:
            with pytest.raises(FrameTooLarge) as caught:
                await FrameReader(stream, max_frame_size=1000).pump(on_frame)
    os.close(write_fd)
    assert seen == [b"first", b"second"]
    assert caught.value.size == 10**6 and caught.value.limit == 1000


async def _read_until_truncated(reader: FrameReader, mode: str) -> tuple[list[bytes], TruncatedFrame]:
    seen: list[bytes] = []

    def on_frame(body: memoryview) -> bool:
        seen.append(bytes(body))
        return False

    try:
        if mode == "pump":
            await reader.pump(on_frame)
        else:
            while (body := await reader.receive()) is not None:
                seen.append(bytes(body))
    except TruncatedFrame as exc:
        return seen, exc
    raise AssertionError(f"no TruncatedFrame; frames: {seen}")


@pytest.mark.parametrize("mode", ["pump", "receive"])
@pytest.mark.parametrize("ending", ["stalled", "ended"])
async def test_a_frame_that_stalls_or_ends_halfway_is_truncated(mode: str, ending: str) -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, _frame(b"whole") + _frame(b"x" * 100)[:50])
    if ending == "ended":
        os.close(write_fd)
    with anyio.fail_after(TIMEOUT):
        async with FdReceiveStream(read_fd) as stream:
            seen, error = await _read_until_truncated(FrameReader(stream, frame_timeout=0.2), mode)
    if ending == "stalled":
        os.close(write_fd)
    assert seen == [b"whole"]
    assert error.received == 50 and error.expected == 100
    assert ending in str(error)


async def test_closing_the_stream_ends_a_pump_that_waits() -> None:
    read_fd, write_fd = os.pipe()
    stream = FdReceiveStream(read_fd)
    reader = FrameReader(stream)
    outcome: list[BaseException] = []

    async def pump() -> None:
        try:
            await reader.pump(lambda body: False)
        except anyio.ClosedResourceError as exc:
            outcome.append(exc)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            await anyio.wait_all_tasks_blocked()
            await stream.aclose()
    os.close(write_fd)
    assert len(outcome) == 1


def test_the_splitter_cuts_frames_however_the_bytes_arrive() -> None:
    bodies = _bodies(7)
    data = b"".join(map(_frame, bodies))
    rng = random.Random(7)
    splitter = FrameSplitter(max_frame_size=2_000_000)
    frames: list[memoryview] = []
    position = 0
    while position < len(data):
        into = splitter.pending_into()
        if into is not None and rng.random() < 0.5:
            count = min(len(into), rng.randrange(1, 200_000))
            into[:count] = data[position : position + count]
            splitter.filled(count, frames)
        else:
            count = rng.randrange(1, 200_000)
            splitter.feed(data[position : position + count], frames)
        position += count
    assert not splitter.inside
    assert [bytes(frame) for frame in frames] == bodies


async def test_a_pump_stopped_midway_resumes_where_it_stopped() -> None:
    # The sidecar stops pumping when too many replies wait (backpressure) and pumps again later.
    bodies = [f"frame {number}".encode() for number in range(30)]
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"".join(map(_frame, bodies)))
    os.close(write_fd)
    seen: list[bytes] = []

    def every_seventh(body: memoryview) -> bool:
        seen.append(bytes(body))
        return len(seen) % 7 == 0

    with anyio.fail_after(TIMEOUT):
        async with FdReceiveStream(read_fd) as stream:
            reader = FrameReader(stream)
            stops = 0
            while await reader.pump(every_seventh):
                stops += 1
    assert seen == bodies
    assert stops == 4  # after frames 7, 14, 21 and 28; then the end of the stream
