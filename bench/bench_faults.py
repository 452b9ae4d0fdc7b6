"""Fault injection, measured: what the caller sees, and how long it takes (docs/reliability.md).

    .venv/bin/python bench/bench_faults.py [--repeat 5] [--backend asyncio|trio] [--only pool]

Each scenario runs against a real sidecar with the fake engine; times are wall-clock
seconds from the fault to what the caller sees, reported as median and maximum.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import anyio.abc

from indextts_client import (
    Client,
    CrashedError,
    InvalidRequestError,
    Pool,
    ProgressEvent,
    RequestTimeoutError,
)
from indextts_sidecar import protocol

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDECAR = [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", "--log-level", "ERROR"]
QUIET = ["--log-level", "ERROR"]


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def fault_while_running(
    client: Client, fault: Callable[[], None], **options: object
) -> tuple[float, BaseException]:
    """Start a request, apply ``fault`` once it runs; seconds until the request fails, and how."""
    started = anyio.Event()

    def progress(event: ProgressEvent) -> None:
        if event.stage == "synthesize":
            started.set()

    outcome: list[BaseException] = []

    async def run() -> None:
        try:
            await client.synthesize("fault", on_progress=progress, idle_timeout=None, **options)  # type: ignore[arg-type]
        except Exception as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await started.wait()
        began = time.perf_counter()
        fault()
    return time.perf_counter() - began, outcome[0]


async def kill9(repeat: int) -> list[float]:
    times = []
    async with Client("fake", sidecar_args=QUIET, restart_backoff=0.0, max_restarts=100) as client:
        for _ in range(repeat):
            pid = client.pid
            assert pid is not None
            seconds, error = await fault_while_running(
                client, lambda pid=pid: os.kill(pid, signal.SIGKILL), hang_at=1, chunk_seconds=0.01
            )
            assert isinstance(error, CrashedError) and error.signal == signal.SIGKILL, error
            times.append(seconds)
            await client.ping()
    return times


async def sigterm_then_call(repeat: int) -> list[float]:
    times = []
    async with Client("fake", sidecar_args=QUIET, restart_backoff=0.0, max_restarts=100) as client:
        for _ in range(repeat):
            await client.ping()
            pid = client.pid
            assert pid is not None
            began = time.perf_counter()
            os.kill(pid, signal.SIGTERM)
            audio = await client.synthesize("after")  # succeeds: restarts if it must
            times.append(time.perf_counter() - began)
            assert len(audio) > 0
    return times


async def sigstop_heartbeat(repeat: int) -> list[float]:
    times = []
    async with Client(
        "fake", sidecar_args=QUIET, restart_backoff=0.0, max_restarts=100, heartbeat=0.5, heartbeat_misses=2
    ) as client:
        for _ in range(repeat):
            pid = client.pid
            assert pid is not None
            seconds, error = await fault_while_running(
                client, lambda pid=pid: os.kill(pid, signal.SIGSTOP), hang_at=1, chunk_seconds=0.01
            )
            assert isinstance(error, CrashedError) and "heartbeat" in error.message, error
            times.append(seconds)
            await client.ping()
    return times


async def aclose_stopped(repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        client = Client("fake", sidecar_args=QUIET)
        await client.start()
        pid = client.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        began = time.perf_counter()
        await client.aclose()
        times.append(time.perf_counter() - began)
    return times


async def hang_idle_timeout(repeat: int) -> list[float]:
    times = []
    async with Client("fake", sidecar_args=QUIET) as client:
        await client.load()
        for _ in range(repeat):
            began = time.perf_counter()
            try:
                await client.synthesize("hang", hang_at=0, idle_timeout=1.0)
            except RequestTimeoutError:
                times.append(time.perf_counter() - began)
    return times


async def long_text(repeat: int) -> list[float]:
    times = []
    async with Client("fake", sidecar_args=QUIET) as client:
        for _ in range(repeat):
            began = time.perf_counter()
            try:
                await client.synthesize("x" * 1_000_000)
            except InvalidRequestError as exc:
                if exc.code == "invalid_input":
                    times.append(time.perf_counter() - began)
    return times


async def deep_frame(repeat: int) -> list[float]:
    body = b"\x91" * 100_000 + b"\xc0"
    times = []
    for _ in range(repeat):
        with subprocess.Popen(SIDECAR, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO) as child:  # noqa: ASYNC220
            assert child.stdin is not None and child.stdout is not None
            child.stdout.read(int.from_bytes(child.stdout.read(4), "big"))  # ready
            began = time.perf_counter()
            child.stdin.write(len(body).to_bytes(4, "big") + body + protocol.frame(protocol.Ping(id=1)))
            child.stdin.flush()
            error = protocol.decode_reply(child.stdout.read(int.from_bytes(child.stdout.read(4), "big")))
            pong = protocol.decode_reply(child.stdout.read(int.from_bytes(child.stdout.read(4), "big")))
            times.append(time.perf_counter() - began)
            assert isinstance(error, protocol.Error) and isinstance(pong, protocol.Pong)
            child.stdin.close()
            assert child.wait(10) == 0
    return times


_FORKING_PARENT = """
import os, signal, subprocess, sys
sidecar = subprocess.Popen(%r, stdin=subprocess.PIPE,
                           env={**os.environ, "INDEXTTS_SIDECAR_PARENT_PID": str(os.getpid())})
if os.fork() == 0:
    os.close(1)
    signal.pause()
print(sidecar.pid, file=sys.stderr, flush=True)
signal.pause()
"""


async def parent_death(repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        parent = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-c", _FORKING_PARENT % SIDECAR],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            start_new_session=True,
        )
        assert parent.stdout is not None and parent.stderr is not None
        parent.stderr.readline()
        parent.stdout.read(int.from_bytes(parent.stdout.read(4), "big"))  # ready
        began = time.perf_counter()
        parent.kill()
        parent.wait()
        rest = parent.stdout.read()  # until the sidecar, the last writer, exits
        times.append(time.perf_counter() - began)
        assert rest, "expected the shutting_down notice"
        os.killpg(parent.pid, signal.SIGKILL)  # the forked worker
    return times


async def unread_pings(repeat: int, *args: str) -> list[float]:
    """MB the sidecar grows by while 200,000 pings are written and no reply is read."""
    growth = []
    ping = protocol.frame(protocol.Ping(id=1))
    for _ in range(repeat):
        with subprocess.Popen([*SIDECAR, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO) as child:  # noqa: ASYNC220
            assert child.stdin is not None and child.stdout is not None
            child.stdout.read(int.from_bytes(child.stdout.read(4), "big"))  # ready
            child.stdin.write(ping)
            child.stdin.flush()
            child.stdout.read(int.from_bytes(child.stdout.read(4), "big"))  # pong: the server runs
            before = rss_of(child.pid)
            fd = child.stdin.fileno()
            os.set_blocking(fd, False)
            data, stalled_since = memoryview(ping * 200_000), None
            while data:
                try:
                    data = data[os.write(fd, data) :]
                    stalled_since = None
                except BlockingIOError:
                    stalled_since = stalled_since or time.monotonic()
                    if time.monotonic() - stalled_since > 1.0:
                        break  # the sidecar stopped reading: it waits for us to read
                    time.sleep(0.01)  # noqa: ASYNC251
            growth.append((rss_of(child.pid) - before) / 1e6)
            child.kill()
    return growth


async def stalled_stream(repeat: int, limit: int = 8 * 1024 * 1024) -> list[float]:
    """MB the parent holds once a stream nobody consumes has produced 1,500 s of audio (72 MB)."""
    from indextts_client import BufferFullError

    growth = []
    for _ in range(repeat):
        async with Client("fake", sidecar_args=QUIET, max_buffered=limit) as client:
            await client.load()
            before = rss_of(os.getpid())
            async with client.stream("stalled", seconds=1500) as stream:
                await client.synthesize("other")  # runs once the stalled one was cancelled
                growth.append((rss_of(os.getpid()) - before) / 1e6)
                try:
                    async for _ in stream:
                        pass
                except BufferFullError:
                    pass
    return growth


# ------------------------------------------------------------------ Pool rows


async def _until_member(pool: Pool, index: int, state: str) -> None:
    while True:  # polled: the pool has no event for it
        if (await pool.health())[index].state == state:
            return
        await anyio.sleep(0.01)


async def pool_revive(repeat: int) -> list[float]:
    """Seconds from a SIGKILL past the member's restart limit to the member ready again (revive_after=1)."""
    times = []
    for _ in range(repeat):
        async with Pool("fake", size=2, max_restarts=0, revive_after=1.0, sidecar_args=QUIET) as pool:
            pid = pool.members[0].pid
            assert pid is not None
            began = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            while not pool.members[0].dead:
                await pool.synthesize("meanwhile")  # retried on member 1
            await _until_member(pool, 0, "ready")
            times.append(time.perf_counter() - began)
    return times


async def _listen(directory: str) -> subprocess.Popen[bytes]:
    command = [*SIDECAR, "--listen", f"unix://{directory}/s.sock", "--token-file", f"{directory}/token"]
    child = subprocess.Popen([*command, "--voice-dir", directory], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)  # noqa: ASYNC220
    assert child.stdout is not None
    line = await anyio.to_thread.run_sync(child.stdout.readline)
    assert line.startswith(b"listening on "), line
    return child


async def pool_remote_back(repeat: int) -> list[float]:
    """Seconds from a remote member's sidecar listening again to that member serving (revive_after=1)."""
    import tempfile

    times = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="itts-") as directory:
            await anyio.Path(directory, "token").write_text("bench-token-0123456789abcdef\n")
            first = await _listen(directory)
            pool = Pool(
                "fake",
                size=1,
                urls=[f"unix://{directory}/s.sock"],
                token="bench-token-0123456789abcdef",
                max_restarts=1,
                restart_backoff=0.0,
                revive_after=1.0,
                sidecar_args=QUIET,
            )
            async with pool:
                first.kill()
                first.wait()
                while not pool.members[1].dead:
                    await pool.synthesize("meanwhile")
                second = await _listen(directory)
                try:
                    began = time.perf_counter()
                    await _until_member(pool, 1, "ready")
                    times.append(time.perf_counter() - began)
                    served = (await pool.health())[1].served
                    for _ in range(4):
                        await pool.synthesize("back")
                    assert (await pool.health())[1].served > served
                finally:
                    second.kill()
                    second.wait()
    return times


async def pool_sigkills(repeat: int) -> list[float]:
    """Requests failed out of 100 concurrent ones while one member of 2 is SIGKILLed 6 times (retries=2)."""
    failed = []
    for _ in range(repeat):
        async with Pool("fake", size=2, retries=2, max_restarts=100, restart_backoff=0.0, sidecar_args=QUIET) as pool:
            errors = 0
            finished = anyio.Event()

            async def one(i: int) -> None:
                nonlocal errors
                try:
                    await pool.synthesize(f"request {i}", seconds=1, chunk_seconds=0.1, delay=0.03)
                except Exception:
                    errors += 1

            async def killer(finished: anyio.Event) -> None:
                member, last, kills = pool.members[0], None, 0
                while kills < 6 and not finished.is_set():
                    pid = member.pid
                    busy = (await pool.health(timeout=1.0))[0].outstanding
                    if pid is not None and pid != last and busy and member.is_alive():
                        os.kill(pid, signal.SIGKILL)
                        kills, last = kills + 1, pid
                    await anyio.sleep(0.01)
                assert kills == 6, kills

            async with anyio.create_task_group() as tg:
                tg.start_soon(killer, finished)
                async with anyio.create_task_group() as requests:
                    for i in range(100):
                        requests.start_soon(one, i)
                finished.set()
            failed.append(float(errors))
    return failed


SCENARIOS: dict[str, tuple[Callable[[int], Awaitable[list[float]]], str]] = {
    "kill -9 during a request": (kill9, "s until CrashedError"),
    "SIGTERM, then a call": (sigterm_then_call, "s for the call (restart included)"),
    "SIGSTOP, heartbeat=0.5 x 2": (sigstop_heartbeat, "s until CrashedError"),
    "aclose() of a stopped sidecar": (aclose_stopped, "s"),
    "hang, idle_timeout=1": (hang_idle_timeout, "s until RequestTimeoutError"),
    "1 MB of text": (long_text, "s until InvalidRequestError"),
    "frame nested 100,000 deep": (deep_frame, "s until the error frame and the next pong"),
    "parent SIGKILLed, forked worker holds the pipes": (parent_death, "s until the sidecar exits"),
    "200,000 pings, replies not read": (unread_pings, "MB sidecar RSS growth"),
    "  the same, --max-outgoing 10**9 (no bound)": (
        lambda repeat: unread_pings(repeat, "--max-outgoing", str(10**9)),
        "MB sidecar RSS growth",
    ),
    "stalled stream, max_buffered=8 MiB": (stalled_stream, "MB parent RSS held"),
    "  the same, max_buffered=1 GiB (no bound)": (lambda repeat: stalled_stream(repeat, 2**30), "MB parent RSS held"),
    "pool member past its restart limit, revive_after=1": (pool_revive, "s from the kill to the member ready"),
    "pool remote member's sidecar back, revive_after=1": (pool_remote_back, "s from listening to the member ready"),
    "pool: 6 SIGKILLs of 1 of 2 members, 100 requests": (pool_sigkills, "requests failed (retries=2)"),
}

# The voice store's rows live in their own module (docs/reliability.md, "Voices").
from _faults_voices import VOICE_SCENARIOS  # noqa: E402

SCENARIOS.update(VOICE_SCENARIOS)


async def main(repeat: int, only: str = "") -> None:
    for name, (scenario, unit) in SCENARIOS.items():
        if only not in name:
            continue
        values = await scenario(repeat)
        print(f"{name:50} median {statistics.median(values):8.3f}  max {max(values):8.3f}  {unit}", flush=True)


# ---------------------------------------------------------------- sockets (--listen)

_TOKEN = "bench-token-0123456789abcdef"


@contextlib.asynccontextmanager
async def _listening(*extra: str) -> AsyncIterator[str]:
    """A fake sidecar listening on a Unix socket (token required) in a fresh directory; yields its URL."""
    with tempfile.TemporaryDirectory(prefix="itts-bench-") as directory:
        token = os.path.join(directory, "token")
        with open(token, "w") as f:  # noqa: ASYNC230
            f.write(_TOKEN)
        listen = "tcp://127.0.0.1:0" if "--tls-cert" in extra else f"unix://{directory}/s.sock"
        command = [*SIDECAR, "--listen", listen, "--token-file", token, *extra]
        process = await anyio.open_process(command, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert process.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive(1)
            yield line.decode().strip().removeprefix("listening on ")
        finally:
            process.kill()
            await process.wait()
            await process.aclose()


def _raw_frame(message: dict[str, object]) -> bytes:
    import msgspec

    body = msgspec.msgpack.encode(message)
    return len(body).to_bytes(4, "big") + body


async def _raw_auth(stream: anyio.abc.ByteStream, more: bytes = b"") -> bytearray:
    """Answer the challenge on ``stream`` (``more`` in the same write); the bytes read past the challenge."""
    import msgspec

    from indextts_sidecar.protocol import auth

    buffer = bytearray()
    while len(buffer) < 4 or len(buffer) < 4 + int.from_bytes(buffer[:4], "big"):
        buffer += await stream.receive()
    size = int.from_bytes(buffer[:4], "big")
    challenge = msgspec.msgpack.decode(bytes(buffer[4 : 4 + size]))
    del buffer[: 4 + size]
    await stream.send(_raw_frame({"op": "auth", "mac": auth.answer(_TOKEN, challenge["nonce"])}) + more)
    return buffer


async def socket_behind_auth(repeat: int) -> list[float]:
    """10 pings in the write that carries ``auth``: seconds until all 10 pongs (before: 0 of 10 answered)."""
    times = []
    async with _listening() as url:
        for _ in range(repeat):
            async with await anyio.connect_unix(url.removeprefix("unix://")) as stream:
                began = time.perf_counter()
                buffer = await _raw_auth(stream, b"".join(_raw_frame({"op": "ping", "id": i}) for i in range(10)))
                pongs = 0
                with anyio.fail_after(30):
                    while pongs < 10:
                        while len(buffer) >= 4 and len(buffer) >= 4 + (size := int.from_bytes(buffer[:4], "big")):
                            pongs += protocol.decode_reply(bytes(buffer[4 : 4 + size])).__class__ is protocol.Pong
                            del buffer[: 4 + size]
                        if pongs < 10:
                            buffer += await stream.receive()
                times.append(time.perf_counter() - began)
    return times


async def socket_idle_unauthenticated(repeat: int) -> list[float]:
    """64 idle connections that never authenticate, then a client: seconds until its first audio
    (before: refused busy, --max-connections full)."""
    times = []
    async with _listening() as url:
        path = url.removeprefix("unix://")
        for _ in range(repeat):
            idle = [await anyio.connect_unix(path) for _ in range(64)]
            try:
                began = time.perf_counter()
                async with Client(url=url, token=_TOKEN) as client:
                    await client.synthesize("let in")
                times.append(time.perf_counter() - began)
            finally:
                for stream in idle:
                    await stream.aclose()
    return times


async def socket_stalled_reader(repeat: int) -> list[float]:
    """One connection stops reading mid-stream (--write-timeout 1): seconds until another connection's
    request, queued behind it, ends (before: none within 30 s)."""
    times = []
    async with _listening("--write-timeout", "1") as url:
        for _ in range(repeat):
            async with await anyio.connect_unix(url.removeprefix("unix://")) as stalled:
                await _raw_auth(stalled)
                await stalled.send(_raw_frame({"op": "synthesize", "id": 1, "text": "x", "options": {"seconds": 1200}}))
                got = len(await stalled.receive())  # its first frames: the request runs
                async with Client(url=url, token=_TOKEN) as other:
                    assert got
                    began = time.perf_counter()
                    with anyio.fail_after(60):
                        await other.synthesize("behind it")
                    times.append(time.perf_counter() - began)
    return times


async def socket_silent_handshake(repeat: int) -> list[float]:
    """A connection that never answers the challenge: seconds until the sidecar closes it (--handshake-timeout 5)."""
    times = []
    async with _listening() as url:
        for _ in range(repeat):
            async with await anyio.connect_unix(url.removeprefix("unix://")) as stream:
                await stream.receive()  # the challenge
                began = time.perf_counter()
                try:
                    with anyio.fail_after(60):
                        while await stream.receive():
                            pass
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    pass
                times.append(time.perf_counter() - began)
    return times


async def socket_plain_client_of_tls(repeat: int) -> list[float]:
    """A client without ssl_context at a TLS sidecar: seconds until StartError(code='tls_required')."""
    from indextts_client import StartError

    times = []
    with tempfile.TemporaryDirectory(prefix="itts-bench-") as directory:
        cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
        subprocess.run(  # noqa: ASYNC221
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        async with _listening("--tls-cert", cert, "--tls-key", key) as url:
            for _ in range(repeat):
                began = time.perf_counter()
                try:
                    async with Client(url=url, token=_TOKEN, max_restarts=0):
                        pass
                except StartError as exc:
                    if exc.code != "tls_required":
                        raise
                    times.append(time.perf_counter() - began)
    return times


SOCKET_SCENARIOS: dict[str, tuple[Callable[[int], Awaitable[list[float]]], str]] = {
    "socket: 10 pings in the write that carries auth": (socket_behind_auth, "s until the 10 pongs"),
    "socket: 64 idle unauthenticated connections": (socket_idle_unauthenticated, "s until a client's audio"),
    "socket: a connection stops reading (--write-timeout 1)": (socket_stalled_reader, "s until another's request ends"),
    "socket: challenge never answered": (socket_silent_handshake, "s until closed"),
    "socket: plain client, TLS sidecar": (socket_plain_client_of_tls, "s until StartError(tls_required)"),
}
SCENARIOS.update(SOCKET_SCENARIOS)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--only", default="", metavar="TEXT", help="run the scenarios whose name holds TEXT")
    args = parser.parse_args()
    anyio.run(main, args.repeat, args.only, backend=args.backend)
