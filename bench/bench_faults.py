"""Fault injection, measured: what the caller sees, and how long it takes (docs/reliability.md).

    .venv/bin/python bench/bench_faults.py [--repeat 5] [--backend asyncio|trio]

Each scenario runs against a real sidecar with the fake engine; times are wall-clock
seconds from the fault to what the caller sees, reported as median and maximum.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import anyio

from indextts_client import (
    Client,
    CrashedError,
    InvalidRequestError,
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
}

# The voice store's rows live in their own module (docs/reliability.md, "Voices").
from _faults_voices import VOICE_SCENARIOS  # noqa: E402

SCENARIOS.update(VOICE_SCENARIOS)


async def main(repeat: int) -> None:
    for name, (scenario, unit) in SCENARIOS.items():
        values = await scenario(repeat)
        print(f"{name:50} median {statistics.median(values):8.3f}  max {max(values):8.3f}  {unit}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = parser.parse_args()
    anyio.run(main, args.repeat, backend=args.backend)
