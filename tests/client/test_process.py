"""The stop ladder on real child processes: each rung is taken only when the one before failed."""

from __future__ import annotations

import os
import signal
import sys

import anyio
import pytest

from indextts_client._supervision._process import Redactor, SidecarProcess, stop_sidecar

pytestmark = pytest.mark.anyio

#: A generous grace: a rung that is not needed is left at once, so the tests never wait it out.
GRACE = 10.0

#: Ignores SIGTERM, prints a line once its signal handlers are set, then obeys its mode:
#: "eof" exits 0 at end of stdin, "stubborn" does not; both exit 3 when they read
#: "shutdown".  Every SIGCONT it receives is reported on stdout as "C".
_CHILD = """
import os, signal, sys, time
mode = sys.argv[1]
signal.signal(signal.SIGCONT, lambda *_: os.write(1, b"C"))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.write(1, b"up\\n")
while True:
    line = sys.stdin.readline()
    if line == "shutdown\\n":
        sys.exit(3)
    if not line and mode == "eof":
        sys.exit(0)
    if not line:
        time.sleep(3600)
"""


async def _spawn(mode: str) -> SidecarProcess:
    child = await SidecarProcess.spawn(
        [sys.executable, "-c", _CHILD, mode], env=dict(os.environ), cwd=None, redact=Redactor({})
    )
    assert await _read(child, 3) == b"up\n"
    return child


async def _read(child: SidecarProcess, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += await child.stdout.receive()
    return data


async def _rest(child: SidecarProcess) -> bytes:
    data = b""
    try:
        while True:
            data += await child.stdout.receive()
    except anyio.EndOfStream:
        return data


async def test_a_child_that_exits_at_end_of_input_is_not_killed() -> None:
    with anyio.fail_after(30):
        child = await _spawn("eof")
        try:
            await stop_sidecar(child, GRACE)
            assert child.process.returncode == 0
            assert await _rest(child) == b"C"  # the one SIGCONT, before anything else
        finally:
            await child.aclose(GRACE)


async def test_shutdown_comes_before_end_of_input_and_signals() -> None:
    with anyio.fail_after(30):
        child = await _spawn("stubborn")
        asked = 0

        async def shutdown() -> None:
            nonlocal asked
            asked += 1
            await child.stdin.send(b"shutdown\n")

        try:
            await stop_sidecar(child, GRACE, shutdown=shutdown)
            assert asked == 1
            assert child.process.returncode == 3
        finally:
            await child.aclose(GRACE)


async def test_a_child_that_ignores_end_of_input_and_sigterm_is_killed() -> None:
    with anyio.fail_after(30):
        child = await _spawn("stubborn")
        try:
            await stop_sidecar(child, 0.5)
            assert child.process.returncode == -signal.SIGKILL
        finally:
            await child.aclose(GRACE)


@pytest.mark.skipif(not hasattr(os, "waitid"), reason="waits for the stop with waitid (POSIX)")
async def test_a_stopped_child_is_continued_once_then_stopped_down_the_ladder() -> None:
    with anyio.fail_after(30):
        child = await _spawn("eof")
        try:
            os.kill(child.pid, signal.SIGSTOP)
            # Returns once it is stopped; WNOWAIT leaves its exit to anyio's reaping.
            await anyio.to_thread.run_sync(os.waitid, os.P_PID, child.pid, os.WSTOPPED | os.WNOWAIT)
            await stop_sidecar(child, GRACE)
            assert child.process.returncode == 0  # continued, it read the end of its input
            assert await _rest(child) == b"C"
        finally:
            await child.aclose(GRACE)


async def test_the_ladder_finishes_in_a_cancelled_scope() -> None:
    with anyio.fail_after(30):
        child = await _spawn("stubborn")
        try:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await stop_sidecar(child, 0.5)
            assert child.process.returncode == -signal.SIGKILL
        finally:
            await child.aclose(GRACE)


async def test_aclose_kills_a_child_the_ladder_did_not_stop_and_closes_the_pipes() -> None:
    with anyio.fail_after(30):
        child = await _spawn("stubborn")
        await child.aclose(GRACE)
        assert child.process.returncode == -signal.SIGKILL
        with pytest.raises(anyio.ClosedResourceError):
            await child.stdin.send(b"x")
        await child.aclose(GRACE)  # idempotent
