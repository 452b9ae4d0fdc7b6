"""The sidecar's Outbox: frames put from the event loop and from another thread, over a real pipe.

Whatever the interleaving, and whether a frame was written at once by the thread that put
it or queued behind a full pipe for the writer task, every frame arrives whole, each
producer's frames in the order it put them, and audio slots come back.
"""

from __future__ import annotations

import os
import threading

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import ByteSendStream

from indextts_sidecar import protocol
from indextts_sidecar._outbox import AUDIO_SLOTS, Outbox, WriteStalled
from indextts_sidecar.protocol.framing import FrameReader
from indextts_sidecar.protocol.streams import FdReceiveStream, FdSendStream

pytestmark = pytest.mark.anyio

TIMEOUT = 30
COUNT = 400


def _frame(source: str, number: int, size: int) -> bytes:
    body = f"{source}:{number}:".encode() + bytes([number % 256]) * size
    return len(body).to_bytes(protocol.HEADER, "big") + body


async def test_frames_from_two_threads_arrive_whole_and_in_order_through_a_full_pipe() -> None:
    read_fd, write_fd = os.pipe()
    received: dict[str, list[int]] = {"loop": [], "thread": []}
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            outbox = Outbox(FdSendStream(write_fd), max_outgoing=1024)
            tg.start_soon(outbox.run)

            def produce() -> None:
                for number in range(COUNT):
                    outbox.audio_slots.acquire()
                    # Big enough that the pipe fills and frames wait for the writer task.
                    outbox.put((_frame("thread", number, 20_000),), audio=True)

            thread = threading.Thread(target=produce)
            thread.start()
            for number in range(COUNT):
                outbox.put((_frame("loop", number, 3_000),))
                if number % 50 == 0:
                    await anyio.lowlevel.checkpoint()
            async with FdReceiveStream(read_fd) as stream:
                reader = FrameReader(stream, max_frame_size=1 << 20)
                while len(received["loop"]) + len(received["thread"]) < 2 * COUNT:
                    body = await reader.receive()
                    assert body is not None
                    source, number, rest = bytes(body).split(b":", 2)
                    size = 3_000 if source == b"loop" else 20_000
                    assert rest == bytes([int(number) % 256]) * size  # whole, not interleaved
                    received[source.decode()].append(int(number))
                await anyio.to_thread.run_sync(thread.join)
                outbox.close()
            assert len(outbox) == 0
            await outbox.aclose()
    assert received == {"loop": list(range(COUNT)), "thread": list(range(COUNT))}
    # Every audio frame gave its slot back once written.
    assert all(outbox.audio_slots.acquire(blocking=False) for _ in range(AUDIO_SLOTS))


async def test_frames_put_after_close_are_dropped_and_release_their_slot() -> None:
    read_fd, write_fd = os.pipe()
    outbox = Outbox(FdSendStream(write_fd), max_outgoing=8)
    outbox.put((_frame("loop", 1, 10),))
    outbox.close()
    outbox.audio_slots.acquire()
    outbox.put((_frame("loop", 2, 10),), audio=True)
    with anyio.fail_after(TIMEOUT):
        await outbox.run()  # nothing queued: ends at once
        await outbox.aclose()
    with os.fdopen(read_fd, "rb") as pipe:
        assert pipe.read() == _frame("loop", 1, 10)
    assert all(outbox.audio_slots.acquire(blocking=False) for _ in range(AUDIO_SLOTS))


class _Unread(ByteSendStream):
    """A stream whose reader takes a chunk only when told to: a client that stops reading."""

    def __init__(self) -> None:
        self.send_side, self.receive_side = anyio.create_memory_object_stream[bytes](0)

    async def send(self, item: bytes) -> None:
        await self.send_side.send(bytes(item))

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        self.send_side.close()
        self.receive_side.close()


async def test_a_stream_that_takes_nothing_within_the_write_timeout_stalls_the_writer() -> None:
    stream = _Unread()
    outbox = Outbox(stream, max_outgoing=8, write_timeout=0.2)
    outbox.put((_frame("loop", 1, 10),))
    began = anyio.current_time()
    with anyio.fail_after(TIMEOUT), pytest.raises(WriteStalled, match=r"0\.2 s"):
        await outbox.run()
    assert anyio.current_time() - began < 2.0  # 10 x the deadline
    await outbox.aclose()


async def test_a_slow_reader_that_keeps_taking_bytes_is_not_stalled() -> None:
    """The deadline is per piece of 256 KiB: 4 MiB taken slowly, longer than the deadline in all
    (17 pieces, 0.2 s each: 3.4 s against 2 s), but each piece well within it, pass."""
    frame = _frame("loop", 1, 4 * 1024 * 1024)
    stream = _Unread()
    outbox = Outbox(stream, max_outgoing=8, write_timeout=2.0)
    outbox.put((frame,))
    outbox.close()
    received = bytearray()
    async with anyio.create_task_group() as tg:
        tg.start_soon(outbox.run)
        with anyio.fail_after(TIMEOUT):
            async for chunk in stream.receive_side:
                received += chunk
                if len(received) == len(frame):
                    break
                await anyio.sleep(0.2)  # a slow reader (not synchronisation)
    assert bytes(received) == frame
    await outbox.aclose()
