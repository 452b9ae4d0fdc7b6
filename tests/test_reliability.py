"""What fuzzing and fault injection found (issue 9): each test failed before its fix."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from anyio.abc import ByteReceiveStream, ByteSendStream
from harness import REPO, Peer, pcm_of, sidecar, spawn
from test_client_support import assert_gone, expected, fake_client

from indextts_client import BufferFullError, CrashedError, EngineError, InvalidRequestError, RequestCancelledError
from indextts_sidecar import protocol
from indextts_sidecar.engines.fake import render_bytes
from indextts_sidecar.protocol import Cancel, Error, Ok, Ping, Pong, Shutdown, Synthesize

pytestmark = pytest.mark.anyio

_enc = msgspec.msgpack.encode


def frame_of(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def raw_map(*pairs: bytes) -> bytes:
    """A msgpack map of already encoded keys and values (at most 15 pairs)."""
    assert len(pairs) % 2 == 0 and len(pairs) < 32
    return bytes([0x80 | len(pairs) // 2]) + b"".join(pairs)


def deep_list(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


async def assert_alive(peer: object, request_id: int) -> None:
    replies = await peer.request(Ping(id=request_id))  # type: ignore[attr-defined]
    assert isinstance(replies[-1], Pong) and replies[-1].id == request_id


# ---------------------------------------------------------------- defect 1


@pytest.mark.parametrize("depth", [1000, 100_000])
async def test_deep_nesting_costs_that_message_only(depth: int) -> None:
    with anyio.fail_after(20):
        async with sidecar("fake") as peer:
            # The reproducer: a bare list nested ``depth`` deep.
            await peer.send_raw(frame_of(deep_list(depth)))
            error = await peer.expect(Error)
            assert error.id is None and error.code == "invalid_message"
            # A request whose options nest that deep: its id is readable, so it gets its terminal frame.
            body = raw_map(
                _enc("op"), _enc("synthesize"), _enc("id"), _enc(5), _enc("text"), _enc("hi"),
                _enc("options"), raw_map(_enc("nested"), deep_list(depth)),
            )  # fmt: skip
            await peer.send_raw(frame_of(body))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail["field"]) == (5, "invalid_message", "$")
            assert f"nested {depth + 2} levels deep" in error.message
            await assert_alive(peer, 6)
            await peer.send(Synthesize(id=7, text="after"))
            frames = await peer.until_terminal(7)
            assert type(frames[-1]).__name__ == "Done"


# ---------------------------------------------------------------- defect 2


async def test_every_op_goes_through_the_same_id_rules() -> None:
    with anyio.fail_after(20):
        async with sidecar("fake") as peer:
            await peer.send(Synthesize(id=7, text="hang", options={"hang_at": 0}))
            await assert_alive(peer, 1)  # 7 is queued or running now
            for duplicate in (Ping(id=7), Cancel(id=7, target=7), Cancel(id=7, target=99), Shutdown(id=7)):
                await peer.send(duplicate)
                error = await peer.expect(Error)
                assert (error.id, error.code, error.detail) == (None, "duplicate_id", {"field": "$.id"}), duplicate
            # The shutdown was refused: the sidecar serves on, and request 7 is untouched.
            health = await peer.request(Ping(id=2))
            assert isinstance(health[-1], Pong) and health[-1].active == 7
            # A cancel naming itself is rejected with its own terminal frame.
            await peer.send(Cancel(id=8, target=8))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail["field"]) == (8, "invalid_message", "$.target")
            await peer.send(Cancel(id=9, target=7))
            per_id = await peer.collect({7, 9})  # asserts that no id ends twice
            assert isinstance(per_id[9][-1], Ok) and per_id[9][-1].info == {"found": True}
            last = per_id[7][-1]
            assert isinstance(last, Error) and last.code == "cancelled"


# ---------------------------------------------------------------- defect 6


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ((_enc("text"), b"\xa2\xff\xfe"), "utf-8"),  # invalid UTF-8 in a string
        ((_enc("text"), _enc("x"), raw_map(_enc(1), _enc(2)), _enc(1)), ""),  # a map as a key: unhashable
        ((_enc("text"), _enc("x"), _enc("options"), raw_map(b"\xa1\xff", _enc(1))), ""),  # a bad key below
    ],
)
async def test_a_readable_id_always_gets_its_terminal_frame(extra: tuple[bytes, ...], fragment: str) -> None:
    with anyio.fail_after(20):
        async with sidecar("fake") as peer:
            await peer.send_raw(frame_of(raw_map(_enc("op"), _enc("synthesize"), _enc("id"), _enc(3), *extra)))
            error = await peer.expect(Error)
            assert (error.id, error.code) == (3, "invalid_message")
            assert fragment in error.message.lower()
            await assert_alive(peer, 4)


@pytest.mark.parametrize("bad_id", [-1, -(2**63), 2**63, 2**64 - 1])
async def test_ids_outside_the_range_are_rejected_not_echoed(bad_id: int) -> None:
    with anyio.fail_after(20):
        async with sidecar("fake") as peer:
            await peer.send_raw(frame_of(raw_map(_enc("op"), _enc("ping"), _enc("id"), _enc(bad_id))))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail["field"]) == (None, "invalid_message", "$.id")
            assert str(bad_id) in error.message
            await assert_alive(peer, protocol.MAX_ID)  # the largest id is fine


async def test_client_refuses_deep_options_before_sending() -> None:
    def nest(depth: int) -> list[object]:
        value: list[object] = []
        for _ in range(depth - 1):
            value = [value]
        return value

    cycle: list[object] = []
    cycle.append(cycle)
    with anyio.fail_after(20):
        async with fake_client() as client:
            pid = client.pid
            # 980: the reproducer on trio (too deep even to encode, depending on the stack).
            for value in (nest(200), nest(980), nest(100_000), cycle):
                with pytest.raises(InvalidRequestError) as caught:
                    await client.synthesize("hi", nested=value)
                assert caught.value.code == "invalid_option" and caught.value.detail["field"] == "$"
                assert "nested" in caught.value.message
            # 64 levels (the top-level map and options count) are sent and decoded.
            with pytest.raises(InvalidRequestError) as caught:
                await client.synthesize("hi", nested=nest(protocol.MAX_DEPTH - 2))
            assert caught.value.code == "unknown_option" and caught.value.detail["field"] == "$.options.nested"
            assert (await client.synthesize("after")).samples.tobytes() == expected("after")
            assert client.pid == pid and client.restarts == 0


# ---------------------------------------------------------------- defect 3


class _Seen(logging.Handler):
    """Sets an event when a log record's message contains ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


async def test_first_call_after_the_sidecar_stops_on_its_own_restarts_it() -> None:
    seen = _Seen("received signal")
    logger = logging.getLogger("indextts_client.sidecar")
    logger.addHandler(seen)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with anyio.fail_after(20):
            async with fake_client() as client:
                await client.load()
                old = client.pid
                assert old is not None
                async with client.request("long", seconds=30, chunk_seconds=0.01, delay=0.01) as running:
                    await running.__anext__()
                    queued = client.request("queued")
                    await queued.start()  # waits behind "long": it will end without a frame
                    os.kill(old, signal.SIGTERM)
                    await seen.event.wait()  # the sidecar has stopped reading
                    # Sent to the dying sidecar, which will never read it: sent again to a new one.
                    audio = await client.synthesize("after")
                    assert audio.samples.tobytes() == expected("after")
                    # Ended with shutting_down before it produced anything: served by the new one too.
                    assert (await queued.result()).samples.tobytes() == expected("queued")
                    # Had produced audio: ends, as documented.
                    with pytest.raises(RequestCancelledError) as caught:
                        await running.result()
                    assert caught.value.code == "shutting_down"
                assert client.pid != old and client.restarts == 1
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)


# ---------------------------------------------------------------- defect 4

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


# ---------------------------------------------------------------- defect 5


async def test_tracebacks_from_the_sidecar_are_redacted() -> None:
    secret = "hunter2-in-a-traceback"
    token = "hf_" + "a1B2c3D4" * 5
    with anyio.fail_after(20):
        async with fake_client(env={"SERVICE_API_KEY": secret}) as client:
            with pytest.raises(EngineError) as caught:
                await client.synthesize("x", fail_at=0, fail_raw=True, fail_message=f"key={secret} token={token}")
    error = caught.value
    assert error.code == "engine_error"
    traceback = error.detail["traceback"]
    assert "RuntimeError: key=*** token=***" in traceback and "Traceback" in traceback
    for text in (traceback, error.message, str(error)):
        assert secret not in text and token not in text


# ---------------------------------------------------------------- bounds


async def test_text_longer_than_the_limit_is_invalid_input() -> None:
    with anyio.fail_after(20):
        async with sidecar("fake", "--max-text", "10") as peer:
            await peer.send(Synthesize(id=1, text="x" * 11))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail) == (1, "invalid_input", {"field": "$.text"})
            assert "11 characters" in error.message and "limit of 10" in error.message
            frames = await peer.request(Synthesize(id=2, text="y" * 10))
            assert pcm_of(frames) == render_bytes("y" * 10, 24000)
        async with fake_client() as client:  # the default: 100,000 characters
            with pytest.raises(InvalidRequestError) as caught:
                await client.synthesize("z" * 100_001)
            assert caught.value.code == "invalid_input" and caught.value.detail["field"] == "$.text"


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


async def test_a_stalled_stream_consumer_fails_its_own_request_only() -> None:
    with anyio.fail_after(30):
        async with fake_client(max_buffered=1_000_000) as client:
            # 100 s at 8 kHz: 1.6 MB of audio, in 0.5 s chunks of 8 kB.
            async with client.stream("stalled", seconds=100) as stalled:
                # The engine runs one request at a time: this one starts only once the
                # stalled stream was cancelled (or finished).
                other = await client.synthesize("other")
                assert other.samples.tobytes() == expected("other")
                with pytest.raises(BufferFullError) as caught:
                    async for _ in stalled:
                        pass
            error = caught.value
            assert error.limit == 1_000_000 and error.request_id is not None
            assert "max_buffered (1000000)" in error.message and "cancelled" in error.message
            health = await client.ping()
            assert health.active is None and health.queue_depth == 0 and client.restarts == 0


async def test_heartbeat_kills_a_stopped_sidecar_and_the_next_call_restarts() -> None:
    with anyio.fail_after(30):
        # A pong takes about a millisecond: 0.5 s is a margin of hundreds.
        async with fake_client(heartbeat=0.5, heartbeat_misses=2) as client:
            await client.load()
            old = client.pid
            assert old is not None
            async with client.request("hang", hang_at=0, idle_timeout=None) as hanging:
                os.kill(old, signal.SIGSTOP)
                with pytest.raises(CrashedError) as caught:
                    await hanging.result()
            error = caught.value
            assert error.signal == signal.SIGKILL
            assert "no pong to 2 heartbeats in a row (0.5 s each)" in error.message
            assert (await client.synthesize("after")).samples.tobytes() == expected("after")
            assert client.pid != old and client.restarts == 1
        assert_gone(old)


async def test_aclose_of_a_stopped_sidecar_is_quick() -> None:
    with anyio.fail_after(30):
        client = fake_client(shutdown_timeout=5.0)
        await client.start()
        pid = client.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        began = time.monotonic()
        await client.aclose()
        # Before: 'shutdown' went unanswered for shutdown_timeout, then SIGTERM waited as long.
        assert time.monotonic() - began < 5.0
    assert_gone(pid)


# ------------------------------------------------------------ parent death

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


async def _two_pids(stream: ByteReceiveStream) -> tuple[int, int]:
    """The line ``SIDECAR_PID WORKER_PID`` a test parent writes once both are up."""
    line = b""
    while not line.endswith(b"\n"):
        line += await stream.receive()
    first, second = map(int, line.split())
    return first, second


async def test_the_sidecar_stops_when_its_parent_dies_despite_a_forked_worker() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    worker = 0
    with anyio.fail_after(20):
        parent = await anyio.open_process([sys.executable, "-c", _FORKING_PARENT], env=env)
        try:
            assert parent.stderr is not None
            _sidecar, worker = await _two_pids(parent.stderr)
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


# ------------------------------------------------ the fake engine validates


async def test_the_fake_engine_rejects_what_real_engines_reject(tmp_path: Path) -> None:
    clip = tmp_path / "speaker.wav"
    clip.write_bytes(b"RIFF a stand-in clip")
    nan = float("nan")
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"text": ""}, "$.text", "text is empty"),
        ({"text": " \n\t"}, "$.text", "text is empty"),
        ({"emotion": {"happy": 5.0}}, "$.emotion.happy", "must be in [0, 1], got 5.0"),
        ({"emotion": {"sad": -1.0}}, "$.emotion.sad", "must be in [0, 1], got -1.0"),
        ({"emotion": {"calm": nan}}, "$.emotion.calm", "got nan"),
        ({"emotion": {"happy": 0.7, "sad": 0.7}}, "$.emotion", "sum to 1.4"),
        ({"emotion": {"happy": 0.5, "alpha": nan}}, "$.emotion.alpha", "got nan"),
        ({"voice": str(tmp_path / "nobody.wav")}, "$.voice", "does not exist"),
        ({"emotion": {"kind": "audio", "path": str(tmp_path)}}, "$.emotion.path", "is a directory"),
    ]
    with anyio.fail_after(30):
        async with fake_client() as client:
            for kwargs, field, fragment in cases:
                text = kwargs.pop("text", "x")
                with pytest.raises(InvalidRequestError) as caught:
                    await client.synthesize(text, **kwargs)
                assert caught.value.code == "invalid_input", kwargs
                assert caught.value.detail["field"] == field and fragment in caught.value.message, caught.value
            audio = await client.synthesize("ok", voice=str(clip), emotion={"happy": 0.6, "calm": 0.4})
            assert audio.samples.tobytes() == expected("ok")
        # validate=false: the old, permissive double, with its fault injection.
        async with fake_client(engine_options={"validate": False}) as client:
            assert len(await client.synthesize("", voice="anything", emotion={"happy": 5.0})) > 0
            with pytest.raises(EngineError) as failed:
                await client.synthesize("", fail_at=0)
            assert failed.value.code == "engine_error"


async def test_the_path_policy(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    inside = voices / "ok.wav"
    inside.write_bytes(b"x" * 100)
    big = voices / "big.wav"
    with open(big, "wb") as f:  # sparse: 10 GB of nothing
        f.truncate(10 * 1024**3)
    outside = tmp_path / "outside.wav"
    outside.write_bytes(b"x")
    (voices / "link.wav").symlink_to(outside)
    fifo = voices / "fifo.wav"
    os.mkfifo(fifo)
    cases = [
        (str(outside), "outside the allowed directories"),
        (str(voices / ".." / "outside.wav"), "outside the allowed directories"),
        (str(voices / "link.wav"), "outside the allowed directories"),
        (str(fifo), "not a regular file"),
        (str(voices), "is a directory"),
        (str(big), "more than the limit of 10485760 (--max-voice-bytes)"),
        (str(voices / "none.wav"), "does not exist"),
    ]
    with anyio.fail_after(30):
        async with fake_client(sidecar_args=["--voice-dir", str(voices)]) as client:
            for path, fragment in cases:
                for kwargs, field in (
                    ({"voice": path}, "$.voice"),
                    ({"emotion": {"kind": "audio", "path": path}}, "$.emotion.path"),
                ):
                    with pytest.raises(InvalidRequestError) as caught:
                        await client.synthesize("x", **kwargs)
                    assert caught.value.code == "invalid_input" and caught.value.detail["field"] == field
                    assert fragment in caught.value.message, (path, caught.value.message)
            assert len(await client.synthesize("x", voice=str(inside))) > 0
        async with fake_client() as client:  # no allow-list: special files are still refused
            for path, fragment in (("/proc/self/mem", "special file"), ("/dev/zero", "special file")):
                with pytest.raises(InvalidRequestError) as caught:
                    await client.synthesize("x", voice=path)
                assert fragment in caught.value.message
            assert len(await client.synthesize("x", voice=str(outside))) > 0


_FORKING_CLIENT = """
import os, signal, anyio
from indextts_client import Client

async def main():
    client = Client("fake", sidecar_args=["--log-level", "WARNING"])
    await client.start()
    worker = os.fork()
    if worker == 0:  # holds every descriptor of the parent, the sidecar's pipes included
        signal.pause()
        os._exit(0)
    print(client.pid, worker, flush=True)
    await anyio.sleep_forever()

anyio.run(main)
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits for the sidecar's exit with a pidfd (Linux)")
async def test_a_client_spawned_sidecar_does_not_outlive_its_parent() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    worker = 0
    with anyio.fail_after(20):
        parent = await anyio.open_process([sys.executable, "-c", _FORKING_CLIENT], env=env)
        try:
            assert parent.stdout is not None
            sidecar_pid, worker = await _two_pids(parent.stdout)
            exited = os.pidfd_open(sidecar_pid)  # readable once the sidecar has exited
            try:
                parent.kill()
                await parent.wait()
                await anyio.wait_readable(exited)
            finally:
                os.close(exited)
        finally:
            with anyio.CancelScope(shield=True):
                if worker:
                    os.kill(worker, signal.SIGKILL)
                if parent.returncode is None:
                    parent.kill()
                await parent.aclose()


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
