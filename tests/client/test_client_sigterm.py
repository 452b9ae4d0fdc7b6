"""A sidecar stopped by SIGTERM: the next call is sent to a new sidecar, never fails; real processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import pytest

from indextts_client import Client
from indextts_sidecar.engines.fake import render_bytes

pytestmark = pytest.mark.anyio

TIMEOUT = 60
ROUNDS = 5


def wait_until_exited(pid: int, limit: float = 10.0) -> None:
    """Block (the event loop too, on purpose) until ``pid`` has exited and is a zombie.

    The client's reader cannot run meanwhile, so it has not yet read the sidecar's
    ``shutting_down`` notice when the next request is written: the write meets a closed pipe.
    """
    stat = Path(f"/proc/{pid}/stat")
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            # Reaped meanwhile (asyncio's child watcher runs in a thread): the entry can
            # vanish between open() and read(), which then raises ESRCH.
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.001)
    raise AssertionError(f"pid {pid} did not exit within {limit} s of SIGTERM")


async def test_a_call_written_after_the_sidecar_exited_on_sigterm_goes_to_a_new_one() -> None:
    with anyio.fail_after(TIMEOUT):
        async with Client(
            "fake", sidecar_args=["--log-level", "ERROR"], restart_backoff=0.0, max_restarts=100
        ) as client:
            for i in range(ROUNDS):
                await client.ping()
                pid = client.pid
                assert pid is not None
                os.kill(pid, signal.SIGTERM)
                wait_until_exited(pid)
                # Before the fix: CrashedError("the sidecar exited with code 0"), the write
                # having failed on the closed pipe after the notice that it read nothing more.
                audio = await client.synthesize(f"after {i}")
                assert audio.samples.tobytes() == render_bytes(f"after {i}")
                assert client.pid != pid
            assert client.restarts == ROUNDS
