"""The order of a connection's frames when a parent reuses an id the moment its request ended.

All of a request's frames, its terminal one last, go out before any frame answering a later
request with the same id.  The engine thread ends a request (its terminal frame, and the id
leaving the set of live ids, under the scheduler's lock) while the event loop reads the next
frame and checks that set (under the same lock): these tests hand the event loop a frame
reusing the id at the instant the id leaves the set, so that it answers it as early as it can,
the interleaving a fuzz of 100,000 frames hit a few times a run.  Both ways out are covered: the engine thread writing
its frames itself (a pipe) and the writer task on the loop writing them (a stream without a
non-blocking write, as a socket is).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any, Union

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest
from harness import pcm_of

from indextts_sidecar import protocol
from indextts_sidecar._server import Server
from indextts_sidecar.engines.fake import FakeEngine, FakeOptions, render_bytes
from indextts_sidecar.protocol.framing import FrameReader
from indextts_sidecar.protocol.streams import FdReceiveStream, FdSendStream

pytestmark = pytest.mark.anyio

TIMEOUT = 30
REUSED = 7


class _LoopWritten(FdSendStream):
    """A pipe without the non-blocking write: every frame goes through the writer task."""

    def __getattribute__(self, name: str) -> Any:
        if name == "try_send_parts":
            raise AttributeError(name)
        return super().__getattribute__(name)


class _Live(dict[int, Any]):
    """The server's live ids; when the engine thread removes ``REUSED``, the loop handles ``body`` at once."""

    def __init__(self, server: Server, body: bytes, token: anyio.lowlevel.EventLoopToken) -> None:
        super().__init__()
        self._server = server
        self._body = body
        self._token = token
        self.fired = False
        self.handler: Union[threading.Thread, None] = None

    def pop(self, key: int, *default: Any) -> Any:
        value = super().pop(key, *default)
        if key == REUSED and not self.fired and value is not None:
            self.fired = True
            # The event loop reads the next frame now, while the engine thread goes on (it
            # holds the lock the loop's check of the live ids waits for: it cannot wait here).
            self.handler = threading.Thread(
                target=anyio.from_thread.run_sync,
                args=(self._server._on_frame, memoryview(self._body)),
                kwargs={"token": self._token},
            )
            self.handler.start()
        return value


async def _serve_and_collect(direct: bool, reuse: protocol.Request) -> list[protocol.Reply]:
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    server = Server(FakeEngine(FakeOptions()))
    live = server._inflight = _Live(server, protocol.encode(reuse), anyio.lowlevel.current_token())
    send = FdSendStream(replies_w) if direct else _LoopWritten(replies_w)
    frames: list[protocol.Reply] = []
    async with anyio.create_task_group() as tg, FdReceiveStream(replies_r) as replies:
        tg.start_soon(server.serve, FdReceiveStream(requests_r), send)
        first = protocol.Synthesize(id=REUSED, text="abc", options={"chunk_seconds": 0.05})
        os.write(requests_w, protocol.frame(first))
        reader = FrameReader(replies)
        while sum(1 for f in frames if protocol.is_terminal(f)) < 2:
            body = await reader.receive()
            assert body is not None, frames
            frames.append(protocol.decode_reply(body))
        os.close(requests_w)  # end of input: the server ends
    assert live.fired and live.handler is not None
    live.handler.join()
    return frames


def _ids_and_kinds(frames: Sequence[protocol.Reply]) -> list[tuple[Union[int, None], str]]:
    return [(getattr(f, "id", None), type(f).__name__) for f in frames if not isinstance(f, protocol.Progress)]


@pytest.mark.parametrize("direct", [True, False], ids=["engine-thread-writes", "loop-writes"])
async def test_a_ping_reusing_an_id_is_answered_after_that_ids_terminal_frame(direct: bool) -> None:
    with anyio.fail_after(TIMEOUT):
        frames = await _serve_and_collect(direct, protocol.Ping(id=REUSED))
    kinds = _ids_and_kinds(frames)
    audio = [k for k in kinds if k[1] == "Audio"]
    assert len(audio) == 4  # 0.18 s of audio in chunks of 0.05 s
    # Every audio frame, then the Done, then the pong: nothing of the reuse before the Done.
    assert kinds == [*audio, (REUSED, "Done"), (REUSED, "Pong")], kinds
    done = next(f for f in frames if isinstance(f, protocol.Done))
    assert done.chunks == 4 and pcm_of(frames) == render_bytes("abc")


@pytest.mark.parametrize("direct", [True, False], ids=["engine-thread-writes", "loop-writes"])
async def test_a_request_reusing_an_id_is_refused_after_that_ids_terminal_frame(direct: bool) -> None:
    bad = protocol.Synthesize(id=REUSED, text="x", options={"no_such_option": 1})
    with anyio.fail_after(TIMEOUT):
        frames = await _serve_and_collect(direct, bad)
    kinds = _ids_and_kinds(frames)
    assert kinds[-2:] == [(REUSED, "Done"), (REUSED, "Error")], kinds
    error = frames[-1]
    assert isinstance(error, protocol.Error) and error.code == "unknown_option"
