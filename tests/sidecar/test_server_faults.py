"""Faults the sidecar's server survives: replies nobody reads, a bug in an engine check,
a dead parent, an older client's shared-memory offer.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from typing import Any

import anyio
import pytest
from anyio.abc import ByteReceiveStream, ByteSendStream
from harness import REPO, Peer, spawn, two_pids

from indextts_sidecar import protocol
from indextts_sidecar.protocol import Error, Ping, Pong, Synthesize

pytestmark = pytest.mark.anyio


class _Feed(ByteReceiveStream):
    """Requests that are all there at once, then a parent that neither writes nor closes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.consumed = 0

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self.consumed >= len(self.data):
            await anyio.sleep_forever()
        chunk = self.data[self.consumed : self.consumed + max_bytes]
        self.consumed += len(chunk)
        return chunk

    async def aclose(self) -> None:
        pass


class _Stalled(ByteSendStream):
    """A parent that never reads its replies: the first write never completes."""

    async def send(self, item: bytes) -> None:
        await anyio.sleep_forever()

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def test_replies_nobody_reads_stop_the_reading_of_requests() -> None:
    from indextts_sidecar._server import Server
    from indextts_sidecar.engines.fake import FakeEngine, FakeOptions

    ping = protocol.frame(Ping(id=1))
    count = 200_000  # 2.4 MB of pings: the 53 MB of queued pongs
    feed = _Feed(ping * count)
    server = Server(FakeEngine(FakeOptions()), max_outgoing=256, shutdown_grace=0)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, feed, _Stalled())
            await anyio.wait_all_tasks_blocked()
            # Every task waits: the writer on the parent, the reader on the queue draining.
            read = feed.consumed // len(ping)
            assert read < 256 + 2 * 65536 // len(ping), read
            assert server._outbox is not None and len(server._outbox) <= 256
            tg.cancel_scope.cancel()


class _Collect(ByteSendStream):
    """A parent that reads every reply."""

    def __init__(self) -> None:
        self.data = bytearray()

    async def send(self, item: bytes) -> None:
        self.data += item

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class _EndingFeed(_Feed):
    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self.consumed >= len(self.data):
            raise anyio.EndOfStream
        return await super().receive(max_bytes)


async def test_a_bug_in_an_engine_check_costs_that_request_only() -> None:
    from indextts_sidecar._server import Server
    from indextts_sidecar.engines.fake import FakeEngine, FakeOptions

    class Buggy(FakeEngine):
        def check(self, request: Any) -> None:
            if request.text == "boom":
                raise ZeroDivisionError("a bug in check()")

    requests = [Synthesize(id=1, text="boom"), Ping(id=2), Synthesize(id=3, text="fine")]
    sent = _Collect()
    server = Server(Buggy(FakeOptions()), shutdown_grace=5)
    with anyio.fail_after(20):
        code = await server.serve(_EndingFeed(b"".join(map(protocol.frame, requests))), sent)
    assert code == 0
    replies, data = [], bytes(sent.data)
    while data:
        size = int.from_bytes(data[:4], "big")
        replies.append(protocol.decode_reply(data[4 : 4 + size]))
        data = data[4 + size :]
    terminal = {reply.id: reply for reply in replies if protocol.is_terminal(reply)}  # type: ignore[union-attr]
    assert set(terminal) == {1, 2, 3}
    boom = terminal[1]
    assert isinstance(boom, Error) and (boom.code, boom.message) == ("internal", "ZeroDivisionError: a bug in check()")
    assert isinstance(terminal[2], Pong)
    # Request 3 was read after the bug: it was served, or ended by the end of input.
    assert type(terminal[3]).__name__ in ("Done", "Error")


_FORKING_PARENT = """
import os, signal, subprocess, sys
sidecar = subprocess.Popen(
    [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", "--log-level", "WARNING"],
    stdin=subprocess.PIPE,
    env={**os.environ, "INDEXTTS_SIDECAR_PARENT_PID": str(os.getpid())},
)
worker = os.fork()
if worker == 0:  # keeps the sidecar's stdin open, and nothing else of ours
    os.close(1)
    signal.pause()
    os._exit(0)
sys.stderr.write(f"{sidecar.pid} {worker}\\n")
sys.stderr.flush()
signal.pause()
"""


async def test_the_sidecar_stops_when_its_parent_dies_despite_a_forked_worker() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    worker = 0
    with anyio.fail_after(20):
        parent = await anyio.open_process([sys.executable, "-c", _FORKING_PARENT], env=env)
        try:
            assert parent.stderr is not None
            _sidecar, worker = await two_pids(parent.stderr)
            peer = Peer(parent, "")
            await peer.expect(protocol.Ready)  # the sidecar writes to the stdout it got from the parent
            parent.kill()
            await parent.wait()
            # The worker still holds the sidecar's stdin: only the parent watch can end it.
            notice = await peer.expect(Error)
            assert (notice.id, notice.code) == (None, "shutting_down")
            assert await peer.recv() is None  # the sidecar closed its end: it exited
        finally:
            with anyio.CancelScope(shield=True):
                if worker:
                    os.kill(worker, signal.SIGKILL)
                if parent.returncode is None:
                    parent.kill()
                await parent.aclose()


_FD_ENV = "INDEXTTS_SIDECAR_SHARED_AUDIO_FD"


@pytest.mark.parametrize(
    ("args", "env"),
    [
        ((), {_FD_ENV: "\u00b2"}),  # passes str.isdigit()
        ((), {_FD_ENV: "abc"}),
        ((), {_FD_ENV: "99999999999999999999"}),
        (("--shared-audio-fd", "-1"), {}),
        (("--shared-audio-fd", "2147483647"), {}),  # a number, but no such descriptor
    ],
)
async def test_an_older_clients_shared_memory_offer_is_declined(args: tuple[str, ...], env: dict[str, str]) -> None:
    # The shared-memory ring is gone: whatever an older client passes, the sidecar starts,
    # does not list the capability (so that client keeps audio in the frames) and serves.
    with anyio.fail_after(20):
        async with spawn("fake", *args, env=env) as peer:
            ready = await peer.expect(protocol.Ready)
            assert "shared_audio" not in ready.capabilities
            frames = await peer.request(protocol.Synthesize(id=1, text="hello", options={"seconds": 1.0}))
            audio = b"".join(bytes(f.pcm) for f in frames if isinstance(f, protocol.Audio))
            assert isinstance(frames[-1], protocol.Done) and len(audio) == 2 * frames[-1].samples > 0
            await peer.stdin.aclose()
            assert await peer.process.wait() == 0
            assert "Traceback" not in peer.stderr()


@pytest.mark.parametrize("where", ["flag", "env"])
def test_an_offered_shared_memory_descriptor_is_closed(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from indextts_sidecar._main import _drop_shared_audio

    read_fd, write_fd = os.pipe()
    try:
        if where == "env":
            monkeypatch.setenv(_FD_ENV, str(write_fd))
        _drop_shared_audio(str(write_fd) if where == "flag" else None)
        assert _FD_ENV not in os.environ  # not for the engine's children either
        with pytest.raises(OSError, match="Bad file descriptor") as closed:
            os.fstat(write_fd)
        assert closed.value.errno == errno.EBADF
    finally:
        os.close(read_fd)
