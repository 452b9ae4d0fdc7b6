"""Sidecars on sockets: real listening processes on loopback TCP and Unix sockets in tmp dirs."""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Union

import anyio
import msgspec
import pytest
from anyio.abc import Process
from harness import listening_process
from voiceclips import clip as audio_clip

from indextts_client import (
    AuthenticationError,
    Client,
    CrashedError,
    InvalidRequestError,
    Pool,
    ProgressEvent,
    RequestCancelledError,
    RestartLimitError,
    SidecarError,
    StartError,
)
from indextts_sidecar.engines.fake import render_bytes

TIMEOUT = 60
TOKEN = "s3cret-token-0123456789abcdef"


def _command(
    directory: Path, listen: str, *extra: str, token: Union[str, None] = TOKEN, voice_dir: bool = True
) -> list[str]:
    args = [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", "--log-level", "WARNING"]
    args += ["--listen", listen, *extra]
    if voice_dir:
        voices = directory / "voices"
        voices.mkdir(exist_ok=True)
        args += ["--voice-dir", str(voices)]
    if token is not None:
        token_file = directory / "token"
        token_file.write_text(token + "\n")
        args += ["--token-file", str(token_file)]
    return args


class Listening:
    def __init__(self, process: Process, url: str) -> None:
        self.process = process
        self.url = url


@asynccontextmanager
async def listening(
    directory: Path,
    transport: str = "unix",
    *extra: str,
    token: Union[str, None] = TOKEN,
    name: str = "s",
    voice_dir: bool = True,
    env: Union[dict[str, str], None] = None,
) -> AsyncIterator[Listening]:
    """A listening sidecar; yields once its 'listening on URL' line arrived; reaps it after."""
    listen = f"unix://{directory / name}.sock" if transport == "unix" else "tcp://127.0.0.1:0"
    with open(directory / f"{name}.log", "ab") as log:
        command = _command(directory, listen, *extra, token=token, voice_dir=voice_dir)
        async with listening_process(command, stderr=log, env=env) as (process, url):
            yield Listening(process, url)


def _client(url: str, **kwargs: Any) -> Client:
    kwargs.setdefault("token", TOKEN)
    kwargs.setdefault("ready_timeout", TIMEOUT)
    return Client(url=url, **kwargs)


# ----------------------------------------------------------------- start-up


def _start(
    directory: Path, listen: str, *extra: str, token: Union[str, None] = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _command(directory, listen, *extra, token=token),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_tcp_without_a_token_refuses_to_start(sockdir: Path) -> None:
    refused = _start(sockdir, "tcp://127.0.0.1:0")
    assert refused.returncode == 2
    assert "--token-file" in refused.stderr and "--insecure" in refused.stderr
    # Off loopback, --insecure is no excuse (refused before anything is bound).
    wide = _start(sockdir, "tcp://0.0.0.0:0", "--insecure")
    assert wide.returncode == 2 and "--token-file" in wide.stderr
    short = sockdir / "short"
    short.write_text("too short\n")
    weak = _start(sockdir, "unix://" + str(sockdir / "y.sock"), "--token-file", str(short))
    assert weak.returncode == 2 and "shorter than 16 bytes" in weak.stderr
    assert "too short" not in weak.stderr  # the token never appears in logs


@pytest.mark.anyio
async def test_insecure_loopback_tcp_serves_without_a_token(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "tcp", "--insecure", token=None) as sidecar:
            assert sidecar.url.startswith("tcp://127.0.0.1:")
            async with Client(url=sidecar.url, ready_timeout=TIMEOUT) as client:
                assert (await client.synthesize("open")).samples.tobytes() == render_bytes("open")


@pytest.mark.anyio
async def test_unix_socket_is_created_mode_0600_and_removed_at_exit(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "unix") as sidecar:
            path = sidecar.url.removeprefix("unix://")
            info = os.stat(path)
            assert stat.S_ISSOCK(info.st_mode)
            assert stat.S_IMODE(info.st_mode) == 0o600
            sidecar.process.send_signal(signal.SIGTERM)
            assert await sidecar.process.wait() == 0
            assert not os.path.exists(path)


# --------------------------------------------------------------- the token


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_a_wrong_or_missing_token_is_refused(sockdir: Path, transport: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, transport) as sidecar:
            with pytest.raises(AuthenticationError) as wrong:
                async with _client(sidecar.url, token="not-the-token-0123456789"):
                    pass
            assert wrong.value.code == "unauthorized"
            assert isinstance(wrong.value, SidecarError)
            with pytest.raises(AuthenticationError, match="requires a token"):
                async with _client(sidecar.url, token=None):
                    pass
            async with _client(sidecar.url, token=f"{TOKEN}\n".encode()) as client:  # as read from the file
                audio = await client.synthesize("hello")
                assert audio.samples.tobytes() == render_bytes("hello")
                assert client.info.engine == "fake"
        log = (sockdir / "s.log").read_text()
        assert "authenticate" in log and TOKEN not in log


# ------------------------------------------------------- many connections


@pytest.mark.anyio
async def test_two_clients_with_fifty_concurrent_requests_each_get_their_own_audio(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "tcp") as sidecar:
            results: dict[tuple[int, int], bytes] = {}

            async def run(c: int) -> None:
                async with _client(sidecar.url) as client:

                    async def one(i: int) -> None:
                        audio = await client.synthesize(f"c{c} r{i}", chunk_seconds=0.05)
                        results[c, i] = audio.samples.tobytes()

                    async with anyio.create_task_group() as tg:
                        for i in range(50):
                            tg.start_soon(one, i)

            async with anyio.create_task_group() as tg:
                tg.start_soon(run, 0)
                tg.start_soon(run, 1)
            assert len(results) == 100
            for (c, i), data in results.items():
                assert data == render_bytes(f"c{c} r{i}"), (c, i)


@pytest.mark.anyio
async def test_one_client_with_a_hundred_queued_requests_does_not_starve_another(sockdir: Path) -> None:
    """Round robin: B's one request runs right after A's running one, not after A's 99 queued."""
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "unix", "--max-queue", "128") as sidecar:
            finished: list[str] = []
            async with _client(sidecar.url) as a, _client(sidecar.url) as b:
                first_started = anyio.Event()

                def started(event: ProgressEvent) -> None:
                    if event.stage == "synthesize":
                        first_started.set()

                async def a_one(i: int) -> None:
                    # 'delay': simulated compute per chunk, so the queue stays long.
                    await a.synthesize(f"a{i}", delay=0.02, on_progress=started if i == 0 else None)
                    finished.append(f"a{i}")

                async with anyio.create_task_group() as tg:
                    tg.start_soon(a_one, 0)
                    await first_started.wait()
                    for i in range(1, 100):
                        tg.start_soon(a_one, i)
                    # Every one of A's requests has reached the sidecar's queue.
                    while (await a.ping()).queue_depth + len(finished) < 99:
                        pass
                    before = len(finished)
                    audio = await b.synthesize("b")
                    finished.append("b")
                    assert audio.samples.tobytes() == render_bytes("b")
                    served_meanwhile = finished.index("b") - before
            assert len(finished) == 101
            # At most A's running request (plus one that raced the queue check) before B's.
            assert served_meanwhile <= 2, (before, served_meanwhile)


@pytest.mark.anyio
async def test_a_dropped_connection_fails_the_stream_typed_and_the_client_reconnects(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        client = _client(f"unix://{sockdir / 's'}.sock", restart_backoff=0.05)
        async with listening(sockdir, "unix") as sidecar, client:
            received: list[bytes] = []

            async def consume() -> None:
                async with client.stream("abcdefghij", chunk_seconds=0.3, hang_at=1) as chunks:
                    async for chunk in chunks:
                        received.append(chunk.samples.tobytes())
                        sidecar.process.kill()  # the connection drops mid-stream

            with pytest.raises(CrashedError):
                await consume()
            assert len(received) == 1
            await sidecar.process.wait()
            # The sidecar is gone: reconnecting fails typed, within the restart budget.
            with pytest.raises(SidecarError):
                await client.synthesize("nobody there")
            # A new sidecar on the same socket: the next call reconnects.
            async with listening(sockdir, "unix"):
                audio = await client.synthesize("back again")
                assert audio.samples.tobytes() == render_bytes("back again")
                assert client.restarts >= 1


@pytest.mark.anyio
async def test_closing_a_connection_cancels_its_own_requests_only(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "unix") as sidecar, _client(sidecar.url) as b:
            a = _client(sidecar.url)
            await a.start()
            holding = anyio.Event()

            def started(event: ProgressEvent) -> None:
                if event.stage == "synthesize":
                    holding.set()

            errors: list[BaseException] = []

            async def hold() -> None:
                try:
                    await a.synthesize("abcdefghij", chunk_seconds=0.3, hang_at=1, on_progress=started)
                except SidecarError as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(hold)
                await holding.wait()
                # B's request queues behind A's hanging one; closing A frees the engine.
                async with anyio.create_task_group() as inner:

                    async def b_one() -> None:
                        audio = await b.synthesize("b after a")
                        assert audio.samples.tobytes() == render_bytes("b after a")

                    inner.start_soon(b_one)
                    while (await b.ping()).queue_depth < 1:
                        pass
                    await a.aclose()
            assert len(errors) == 1 and type(errors[0]).__name__ in ("ClosedError", "RequestCancelledError")
            health = await b.ping()
            assert health.queue_depth == 0 and health.active is None


@pytest.mark.anyio
async def test_register_voice_uploads_a_clip_that_requests_can_name(sockdir: Path) -> None:
    clip = audio_clip()
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "tcp") as sidecar, _client(sidecar.url) as client:
            assert "registered_voices" in client.info.capabilities
            voice = await client.register_voice("alice", clip)
            assert voice == "registered:alice"
            audio = await client.synthesize("with a voice", voice=voice)
            assert audio.samples.tobytes() == render_bytes("with a voice")
            stored = list((sockdir / "voices" / ".registered-voices").glob("*.wav"))
            assert [p.read_bytes() for p in stored] == [clip] and stored[0].suffix == ".wav"
            # The same clip under a second name is stored once.
            await client.register_voice("alice2", clip)
            assert len(list((sockdir / "voices" / ".registered-voices").glob("*.wav"))) == 1
            with pytest.raises(InvalidRequestError, match="no voice is registered"):
                await client.synthesize("x", voice="registered:bob")
            with pytest.raises(InvalidRequestError, match="voice name"):
                await client.register_voice("../escape", clip)
            # A path outside --voice-dir is refused over a socket.
            outside = sockdir / "outside.wav"
            outside.write_bytes(clip)
            with pytest.raises(InvalidRequestError, match="outside the allowed directories"):
                await client.synthesize("x", voice=str(outside))


@pytest.mark.anyio
async def test_register_voice_is_bounded_in_size_and_count(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with (
            listening(sockdir, "unix", "--max-voice-bytes", "1000", "--max-voices", "2") as sidecar,
            _client(sidecar.url) as client,
        ):
            with pytest.raises(InvalidRequestError, match="more than the limit of 1000"):
                await client.register_voice("big", b"x" * 1001)
            one, two, three, four = (audio_clip(0.01, seed=seed) for seed in range(4))
            await client.register_voice("one", one)
            await client.register_voice("two", two)
            with pytest.raises(InvalidRequestError, match="all of them named"):
                await client.register_voice("three", three)
            # A name given a new clip lets its old clip make room.
            await client.register_voice("one", four)
            names = sorted(p.read_bytes() for p in (sockdir / "voices" / ".registered-voices").glob("*.wav"))
            assert names == sorted([two, four])
            audio = await client.synthesize("still there", voice="registered:two")
            assert audio.samples.tobytes() == render_bytes("still there")


@pytest.mark.anyio
async def test_a_pool_mixes_remote_and_local_members(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with (
            listening(sockdir, "unix") as sidecar,
            Pool("fake", size=1, urls=[sidecar.url], token=TOKEN, max_outstanding=1) as pool,
        ):
            results: dict[int, bytes] = {}

            async def one(i: int) -> None:
                results[i] = (await pool.synthesize(f"pool {i}")).samples.tobytes()

            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(one, i)
            assert results == {i: render_bytes(f"pool {i}") for i in range(6)}
            health = await pool.health()
            assert [h.url for h in health] == [None, sidecar.url]
            assert all(h.served >= 1 for h in health), health


@pytest.mark.anyio
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
async def test_tls_with_a_token(sockdir: Path) -> None:
    import ssl

    cert, key = sockdir / "cert.pem", sockdir / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
            *("-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=TIMEOUT,
    )
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "tcp", "--tls-cert", str(cert), "--tls-key", str(key)) as sidecar:
            context = ssl.create_default_context(cafile=str(cert))
            async with _client(sidecar.url, ssl_context=context) as client:
                audio = await client.synthesize("over tls")
                assert audio.samples.tobytes() == render_bytes("over tls")
            with pytest.raises(AuthenticationError):
                async with _client(sidecar.url, ssl_context=context, token="wrong-token-0123456789abc"):
                    pass
            # A client that does not trust the certificate never gets to the token.
            with pytest.raises(SidecarError, match="cannot connect"):
                async with _client(sidecar.url, ssl_context=ssl.create_default_context()):
                    pass


class RawPeer:
    """A parent written from docs/protocol.md alone: frames over a socket, no client code."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def send(self, message: dict[str, Any]) -> None:
        body = msgspec.msgpack.encode(message)
        await self.stream.send(len(body).to_bytes(4, "big") + body)

    async def recv(self) -> Union[dict[str, Any], None]:
        while True:
            if len(self.buffer) >= 4:
                size = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) >= 4 + size:
                    body = bytes(self.buffer[4 : 4 + size])
                    del self.buffer[: 4 + size]
                    message: dict[str, Any] = msgspec.msgpack.decode(body)
                    return message
            try:
                self.buffer += await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return None

    async def until_terminal(self, request_id: int) -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = []
        while True:
            frame = await self.recv()
            assert frame is not None, frames
            frames.append(frame)
            if frame.get("id") == request_id and frame["op"] in ("done", "ok", "pong", "error"):
                return frames


def _mac(token: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, b"indextts-sidecar auth v1\0" + nonce, hashlib.sha256).digest()


@pytest.mark.anyio
async def test_the_exchange_on_the_wire_own_ids_per_connection_and_shutdown_ends_one_connection(
    sockdir: Path,
) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "unix") as sidecar:
            path = sidecar.url.removeprefix("unix://")
            async with await anyio.connect_unix(path) as s1, await anyio.connect_unix(path) as s2:
                peers = [RawPeer(s1), RawPeer(s2)]
                for peer in peers:
                    challenge = await peer.recv()
                    assert challenge is not None and challenge["op"] == "challenge"
                    assert challenge["method"] == "hmac-sha256" and len(challenge["nonce"]) == 32
                    await peer.send({"op": "auth", "mac": _mac(TOKEN.encode(), challenge["nonce"])})
                    ready = await peer.recv()
                    assert ready is not None and ready["op"] == "ready" and ready["protocol"] == 1
                # The same id on both connections: two requests, each answered on its own connection.
                await peers[0].send({"op": "synthesize", "id": 1, "text": "first"})
                await peers[1].send({"op": "synthesize", "id": 1, "text": "second"})
                for peer, text in zip(peers, ("first", "second"), strict=True):
                    frames = await peer.until_terminal(1)
                    pcm = b"".join(f["pcm"] for f in frames if f["op"] == "audio")
                    assert frames[-1]["op"] == "done" and pcm == render_bytes(text)
                # shutdown ends the connection that sent it, not the sidecar.
                await peers[0].send({"op": "shutdown", "id": 2})
                assert (await peers[0].until_terminal(2))[-1]["op"] == "ok"
                assert await peers[0].recv() is None
                await peers[1].send({"op": "ping", "id": 2})
                assert (await peers[1].until_terminal(2))[-1]["op"] == "pong"
            # A wrong answer: refused after the fixed delay, then closed.
            async with await anyio.connect_unix(path) as s3:
                peer = RawPeer(s3)
                challenge = await peer.recv()
                assert challenge is not None
                began = anyio.current_time()
                await peer.send({"op": "auth", "mac": _mac(b"wrong-token-0123456789", challenge["nonce"])})
                refusal = await peer.recv()
                assert refusal is not None and refusal["op"] == "error" and refusal["code"] == "unauthorized"
                assert "id" not in refusal
                assert anyio.current_time() - began >= 0.9  # the fixed delay (a lower bound only)
                assert await peer.recv() is None


@pytest.mark.anyio
async def test_sigterm_ends_every_connection_s_requests_with_a_typed_error(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "tcp") as sidecar, _client(sidecar.url, max_restarts=0) as client:
            running = anyio.Event()

            def started(event: ProgressEvent) -> None:
                if event.stage == "synthesize":
                    running.set()

            outcomes: dict[str, BaseException] = {}

            async def one(name: str, **options: Any) -> None:
                try:
                    await client.synthesize("abcdefghij", chunk_seconds=0.3, **options)
                except SidecarError as exc:
                    outcomes[name] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: one("running", hang_at=1, on_progress=started))
                await running.wait()
                tg.start_soon(one, "queued")
                while (await client.ping()).queue_depth < 1:
                    pass
                sidecar.process.send_signal(signal.SIGTERM)
            assert await sidecar.process.wait() == 0
            # The running request had started: it ends with shutting_down.
            assert isinstance(outcomes["running"], RequestCancelledError)
            assert outcomes["running"].code == "shutting_down"
            # The queued one produced nothing, so the client sends it again, as to a restarted
            # sidecar; with max_restarts=0 that fails typed instead of hanging.
            assert isinstance(outcomes["queued"], RestartLimitError)


@pytest.mark.anyio
async def test_connections_beyond_max_connections_are_refused_busy(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with (
            listening(sockdir, "unix", "--max-connections", "1") as sidecar,
            _client(sidecar.url) as first,
        ):
            with pytest.raises(StartError) as refused:
                async with _client(sidecar.url):
                    pass
            assert refused.value.code == "busy"
            assert (await first.synthesize("still served")).samples.tobytes() == render_bytes("still served")


@pytest.mark.anyio
async def test_the_heartbeat_drops_the_connection_to_a_stopped_remote_sidecar(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "unix") as sidecar:
            try:
                async with _client(sidecar.url, heartbeat=0.2, heartbeat_misses=2) as client:
                    await client.ping()
                    sidecar.process.send_signal(signal.SIGSTOP)  # hung: the socket stays open
                    with pytest.raises(CrashedError, match="heartbeats in a row"):
                        await client.synthesize("never answered", idle_timeout=None)
            finally:
                sidecar.process.send_signal(signal.SIGCONT)


@pytest.mark.anyio
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
async def test_connections_leave_no_descriptors_behind_in_the_sidecar(sockdir: Path) -> None:
    def descriptors(pid: int) -> int:
        return len(os.listdir(f"/proc/{pid}/fd"))

    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "tcp") as sidecar, _client(sidecar.url) as probe:
            await probe.synthesize("warm")  # the engine loaded, its files open
            # The first pong opens /proc/self/statm and keeps it: count after one, or the
            # loop below waits for a descriptor that stays open by design.
            await probe.ping()
            baseline = descriptors(sidecar.process.pid)

            async def good(i: int) -> None:
                async with _client(sidecar.url) as client:
                    await client.synthesize(f"client {i}")

            async def refused() -> None:
                with pytest.raises(AuthenticationError):
                    async with _client(sidecar.url, token="wrong-token-0123456789abc"):
                        pass

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(good, i)
                for _ in range(3):
                    tg.start_soon(refused)
            # Each pong is answered after the sidecar's loop handled what came before it; the
            # loop ends once every closed connection's descriptor is closed (else fail_after).
            while descriptors(sidecar.process.pid) != baseline:
                await probe.ping()


@pytest.mark.anyio
async def test_a_pool_of_remote_sidecars_survives_losing_one_under_load(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with (
            listening(sockdir, "unix", name="one") as first,
            listening(sockdir, "unix", name="two") as second,
            Pool(urls=[first.url, second.url], token=TOKEN, max_outstanding=4, restart_backoff=0.05) as pool,
        ):
            results: dict[int, bytes] = {}
            some_done = anyio.Event()

            async def one(i: int) -> None:
                results[i] = (await pool.synthesize(f"load {i}", delay=0.02)).samples.tobytes()
                if len(results) == 4:
                    some_done.set()

            async with anyio.create_task_group() as tg:
                for i in range(24):
                    tg.start_soon(one, i)
                await some_done.wait()
                first.process.kill()
            assert results == {i: render_bytes(f"load {i}") for i in range(24)}
            health = await pool.health()
            assert health[1].state == "ready" and health[1].served >= 12


@pytest.mark.anyio
async def test_register_voice_works_over_pipes_too_and_needs_a_voice_dir(sockdir: Path) -> None:
    voices = sockdir / "voices"
    voices.mkdir()
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", sidecar_args=["--voice-dir", str(voices)], ready_timeout=TIMEOUT) as client:
            voice = await client.register_voice("carol", audio_clip(fmt="FLAC"))
            audio = await client.synthesize("piped", voice=voice, emotion={"kind": "audio", "path": voice})
            assert audio.samples.tobytes() == render_bytes("piped")
            assert [p.suffix for p in (voices / ".registered-voices").glob("[0-9a-f]*")] == [".flac"]
        async with Client("fake", ready_timeout=TIMEOUT) as plain:
            assert "registered_voices" not in plain.info.capabilities
            with pytest.raises(InvalidRequestError, match="--voice-dir"):
                await plain.register_voice("carol", b"x")
            with pytest.raises(InvalidRequestError, match="--voice-dir"):
                await plain.synthesize("x", voice="registered:carol")


# ------------------------------------------------------ hostile and stalled peers (issue 23)


async def _authenticated(path: str, *, more: bytes = b"") -> RawPeer:
    """A raw connection past the token exchange; ``more`` goes out in the same write as ``auth``."""
    peer = RawPeer(await anyio.connect_unix(path))
    challenge = await peer.recv()
    assert challenge is not None and challenge["op"] == "challenge"
    body = msgspec.msgpack.encode({"op": "auth", "mac": _mac(TOKEN.encode(), challenge["nonce"])})
    await peer.stream.send(len(body).to_bytes(4, "big") + body + more)
    ready = await peer.recv()
    assert ready is not None and ready["op"] == "ready", ready
    return peer


def _frames(*messages: dict[str, Any]) -> bytes:
    bodies = [msgspec.msgpack.encode(m) for m in messages]
    return b"".join(len(b).to_bytes(4, "big") + b for b in bodies)


@pytest.mark.anyio
async def test_requests_written_right_behind_auth_are_served(sockdir: Path) -> None:
    pings = [{"op": "ping", "id": i} for i in range(1, 11)]
    # 100 KB of text: more than any single read of the handshake would take.
    long_text = "a" * 100_000
    big = {"op": "synthesize", "id": 11, "text": long_text, "options": {"seconds": 0.01}}
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "unix") as sidecar:
            peer = await _authenticated(sidecar.url.removeprefix("unix://"), more=_frames(*pings, big))
            async with peer.stream:
                terminal: dict[int, str] = {}
                while len(terminal) < 11:
                    frame = await peer.recv()
                    assert frame is not None, terminal
                    if frame["op"] in ("pong", "done", "error"):
                        terminal[frame["id"]] = frame["op"]
            assert terminal == {**{i: "pong" for i in range(1, 11)}, 11: "done"}


@pytest.mark.anyio
async def test_idle_unauthenticated_connections_cannot_keep_a_client_out(sockdir: Path) -> None:
    idle: list[RawPeer] = []
    with anyio.fail_after(TIMEOUT):
        # As many idle connections as --max-connections allows served ones (64), and more:
        # they need no token, so they must not count against it.
        async with listening(sockdir, "unix", "--max-handshakes", "8") as sidecar:
            path = sidecar.url.removeprefix("unix://")
            for _ in range(80):
                peer = RawPeer(await anyio.connect_unix(path))
                idle.append(peer)
                challenge = await peer.recv()  # accepted, and in its handshake
                assert challenge is not None and challenge["op"] == "challenge"
            async with _client(sidecar.url) as client:
                audio = await client.synthesize("let in")
                assert audio.samples.tobytes() == render_bytes("let in")
            # Each connection past the 8 pending ones closed the oldest: at most 8 are left.
            closed = 0
            for peer in idle:
                with anyio.move_on_after(0.5):  # an open one stays silent: it is not waited for
                    if await peer.recv() is None:
                        closed += 1
            assert closed >= 80 - 8, closed
    for peer in idle:
        await peer.stream.aclose()


@pytest.mark.anyio
async def test_a_connection_that_never_answers_the_challenge_is_closed_at_the_handshake_deadline(
    sockdir: Path,
) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "unix", "--handshake-timeout", "0.5") as sidecar:
            async with await anyio.connect_unix(sidecar.url.removeprefix("unix://")) as stream:
                peer = RawPeer(stream)
                assert (await peer.recv() or {}).get("op") == "challenge"
                began = anyio.current_time()
                assert await peer.recv() is None  # closed, no ready, no error
                assert anyio.current_time() - began < 5.0  # 10 x the deadline
            assert "--handshake-timeout" in (sockdir / "s.log").read_text()


@pytest.mark.anyio
async def test_a_stalled_connection_is_cancelled_and_closed_and_holds_up_no_other(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "unix", "--write-timeout", "1") as sidecar:
            path = sidecar.url.removeprefix("unix://")
            # 20 minutes of audio that nobody reads: the socket's buffers fill, then the
            # outbox's audio slots, then the engine thread waits on this connection.
            stalled = await _authenticated(path)
            await stalled.send({"op": "synthesize", "id": 1, "text": "x", "options": {"seconds": 1200}})
            async with _client(sidecar.url) as other:
                audio = await other.synthesize("not held up")
                assert audio.samples.tobytes() == render_bytes("not held up")
                health = await other.ping()
                assert health.queue_depth == 0 and health.active is None
            # The stalled connection was closed: reading it now drains what was buffered, then ends.
            async with stalled.stream:
                while (frame := await stalled.recv()) is not None:
                    assert frame["op"] in ("audio", "progress", "error"), frame
        assert "--write-timeout" in (sockdir / "s.log").read_text()


@pytest.mark.anyio
async def test_without_voice_dir_a_socket_serves_uploads_only_from_a_private_directory(sockdir: Path) -> None:
    tmp = sockdir / "tmp"
    tmp.mkdir()
    clip = audio_clip()
    named = sockdir / "speaker.wav"
    named.write_bytes(clip)
    with anyio.fail_after(TIMEOUT):
        async with (
            listening(sockdir, "unix", voice_dir=False, env={"TMPDIR": str(tmp)}) as sidecar,
            _client(sidecar.url) as client,
        ):
            assert "registered_voices" in client.info.capabilities
            with pytest.raises(InvalidRequestError, match="register_voice") as refused:
                await client.synthesize("by path", voice=str(named))
            assert refused.value.detail["field"] == "$.voice"
            with pytest.raises(InvalidRequestError, match="register_voice"):
                await client.synthesize("by path", emotion={"kind": "audio", "path": str(named)})
            voice = await client.register_voice("dana", clip)
            audio = await client.synthesize("uploaded", voice=voice, emotion={"kind": "audio", "path": voice})
            assert audio.samples.tobytes() == render_bytes("uploaded")
            (private,) = tmp.iterdir()  # the upload store lives here while the sidecar runs
            stored = list(private.rglob("*.wav"))
            assert [p.read_bytes() for p in stored] == [clip]
            sidecar.process.send_signal(signal.SIGTERM)
            assert await sidecar.process.wait() == 0
        assert list(tmp.iterdir()) == []  # removed at exit
        assert "without --voice-dir" in (sockdir / "s.log").read_text()


@pytest.mark.anyio
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
async def test_a_plain_client_of_a_tls_sidecar_is_told_that_tls_is_expected(sockdir: Path) -> None:
    cert, key = sockdir / "cert.pem", sockdir / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
            *("-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=TIMEOUT,
    )
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir, "tcp", "--tls-cert", str(cert), "--tls-key", str(key)) as sidecar:
            with pytest.raises(StartError, match="expects TLS") as plain:
                async with _client(sidecar.url, max_restarts=0):
                    pass
            assert plain.value.code == "tls_required" and "ssl_context" in plain.value.message
            # A peer that speaks first, but no TLS, is told the same.
            address = sidecar.url.removeprefix("tcp://").rsplit(":", 1)
            async with await anyio.connect_tcp(address[0], int(address[1])) as stream:
                peer = RawPeer(stream)
                await peer.send({"op": "ping", "id": 1})
                told = await peer.recv()
                assert told is not None and told["op"] == "error" and told["code"] == "tls_required"
                assert "id" not in told
                assert await peer.recv() is None


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-handshakes", "0"), ("--handshake-timeout", "0"), ("--write-timeout", "nan"), ("--write-timeout", "inf")],
)
def test_the_socket_bounds_refuse_values_that_bound_nothing(sockdir: Path, flag: str, value: str) -> None:
    refused = _start(sockdir, f"unix://{sockdir}/b.sock", flag, value, "--token-file", str(_token_file(sockdir)))
    assert refused.returncode == 2
    assert flag in refused.stderr and "Traceback" not in refused.stderr


def _token_file(directory: Path) -> Path:
    path = directory / "token"
    path.write_text(TOKEN + "\n")
    return path
