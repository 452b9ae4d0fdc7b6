"""A sidecar that stops on its own, hangs, or loses its parent: what the client does; real processes."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import anyio
import pytest
from client_support import assert_gone, expected, fake_client
from harness import REPO, two_pids

from indextts_client import CrashedError, RequestCancelledError

pytestmark = pytest.mark.anyio


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
            sidecar_pid, worker = await two_pids(parent.stdout)
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
