"""The request seam of ``Connection``: a request driven by its public methods alone, against a real sidecar.

``open_exchange``, ``send``, ``wait``, ``abandon`` and ``room`` are all a request run uses of
its connection (see ``indextts_client._wire._exchange.Channel``); here a test drives them itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from client_support import FAKE_OPTIONS, RATE, expected
from harness import spawn

from indextts_client import ClosedError, Connection, InvalidRequestError
from indextts_client._wire._exchange import ABANDONED, ENDED, Exchange
from indextts_sidecar import protocol

pytestmark = pytest.mark.anyio

#: Far enough that reaching it means something failed: every test is bounded well below it.
FAR = 60.0
_OPTIONS = [arg for key, value in FAKE_OPTIONS.items() for arg in ("--option", f"{key}={value}")]


@asynccontextmanager
async def connection(*args: str) -> AsyncIterator[Connection]:
    """A Connection over the pipes of a spawned fake sidecar."""
    async with spawn("fake", *_OPTIONS, *args) as peer, Connection(peer.stdout, peer.stdin) as conn:
        yield conn


async def drain(conn: Connection, exchange: Exchange) -> list[protocol.Reply]:
    """Every frame of ``exchange`` up to its terminal one, read through the seam alone."""
    frames: list[protocol.Reply] = []
    while True:
        item = exchange.next_item()
        if item is None:
            assert exchange.error is None
            await conn.wait(exchange, conn.clock() + FAR)
            continue
        frames.append(item)
        if protocol.is_terminal(item):
            return frames


async def test_a_request_driven_through_the_seam_alone_gets_all_its_audio() -> None:
    with anyio.fail_after(30):
        async with connection() as conn:
            exchange = conn.open_exchange(lambda i: protocol.Synthesize(id=i, text="seam", options={}))
            assert conn.pending == 1 and exchange.data
            await conn.send(exchange)
            frames = await drain(conn, exchange)
            audio = [f for f in frames if isinstance(f, protocol.Audio)]
            done = frames[-1]
            assert isinstance(done, protocol.Done) and done.id == exchange.id
            assert b"".join(bytes(a.pcm) for a in audio) == expected("seam")
            assert done.samples == len(expected("seam")) // 2 and done.sample_rate == RATE
            assert exchange.state is ENDED and exchange.buffered == 0 and conn.pending == 0


async def test_synthesize_audio_is_assembled_by_the_reader_and_never_queued() -> None:
    with anyio.fail_after(30):
        async with connection() as conn:
            exchange = conn.open_exchange(lambda i: protocol.Synthesize(id=i, text="assembled", options={}))
            exchange.progress_wanted = False
            assembler = exchange.assemble_audio()
            await conn.send(exchange)
            frames = await drain(conn, exchange)
            assert [type(f) for f in frames] == [protocol.Done]
            assert exchange.taken_by_reader >= 1
            done = frames[0]
            assert isinstance(done, protocol.Done)
            assembler.check_done(done.samples, done.chunks, done.sample_rate)
            assert assembler.assemble().tobytes() == expected("assembled")


async def test_abandon_with_cancel_frees_the_engine_for_the_next_request() -> None:
    with anyio.fail_after(30):
        async with connection() as conn:
            # Two minutes of audio, a second per chunk: only a cancel ends it in time.
            long = conn.open_exchange(
                lambda i: protocol.Synthesize(id=i, text="long", options={"seconds": 120, "delay": 1.0})
            )
            await conn.send(long)
            cancel_written = conn.abandon(long, cancel=True)
            assert cancel_written is not None and long.state is ABANDONED
            assert conn.abandon(long, cancel=True) is cancel_written  # a second abandon changes nothing
            await cancel_written.wait()
            audio = await conn.synthesize("next")
            assert audio.samples.tobytes() == expected("next")
            # The abandoned request's end and the cancel's ``ok`` came before it, and were dropped.
            assert conn.pending == 0 and not long.items


async def test_abandon_without_cancel_drops_the_answer_and_sends_nothing() -> None:
    with anyio.fail_after(30):
        async with connection() as conn:
            ping = conn.open_exchange(lambda i: protocol.Ping(id=i))
            await conn.send(ping)
            assert conn.abandon(ping, cancel=False) is None
            health = await conn.ping()  # pings are answered in order: the first pong came before
            assert health.loaded is not None
            assert conn.pending == 0 and not ping.items and ping.state is ABANDONED


async def test_abandoning_a_request_never_sent_forgets_it_at_once() -> None:
    with anyio.fail_after(30):
        async with connection() as conn:
            exchange = conn.open_exchange(lambda i: protocol.Ping(id=i))
            assert conn.pending == 1
            assert conn.abandon(exchange, cancel=True) is None
            assert conn.pending == 0
            assert (await conn.ping()).queue_depth == 0


async def test_wait_returns_at_the_deadline_when_nothing_arrives() -> None:
    with anyio.fail_after(30):
        async with connection() as conn:
            slow = conn.open_exchange(lambda i: protocol.Synthesize(id=i, text="slow", options={"delay": FAR}))
            slow.progress_wanted = False
            await conn.send(slow)
            deadline = conn.clock() + 0.2
            await conn.wait(slow, deadline)
            assert conn.clock() >= deadline
            assert not slow.items and slow.error is None
            cancelled = conn.abandon(slow, cancel=True)
            assert cancelled is not None
            await cancelled.wait()


async def test_room_is_set_when_a_request_of_the_connection_ends() -> None:
    with anyio.fail_after(30):
        async with connection() as conn:
            assert conn.room() is None  # nothing in flight: no end is coming
            exchange = conn.open_exchange(lambda i: protocol.Synthesize(id=i, text="room", options={}))
            await conn.send(exchange)
            room = conn.room()
            assert room is not None
            await room.wait()
            assert conn.pending == 0 and exchange.state is ENDED


async def test_open_exchange_refuses_a_request_over_the_sidecars_frame_size_and_the_connection_goes_on() -> None:
    with anyio.fail_after(30):
        async with connection("--max-frame-size", str(protocol.MIN_MAX_FRAME_SIZE)) as conn:
            assert conn.info.max_frame_size == protocol.MIN_MAX_FRAME_SIZE
            with pytest.raises(InvalidRequestError) as caught:
                conn.open_exchange(lambda i: protocol.Synthesize(id=i, text="x" * protocol.MIN_MAX_FRAME_SIZE))
            assert caught.value.code == "invalid_input"
            assert conn.pending == 0
            assert (await conn.synthesize("fits")).samples.tobytes() == expected("fits")


async def test_asked_to_stop_says_whether_this_side_stopped_the_sidecar() -> None:
    with anyio.fail_after(30):
        async with connection() as conn:
            assert not conn.asked_to_stop
            await conn.shutdown()
            assert conn.asked_to_stop
            assert isinstance(await conn.wait_closed(), ClosedError)  # the end was expected
            with pytest.raises(ClosedError):
                conn.open_exchange(lambda i: protocol.Ping(id=i))
