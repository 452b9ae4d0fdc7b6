"""The supervisor over a transport of the test's own: it opens one per session and asks nothing else of it.

The transport spawns a real sidecar (harness.spawn) but hands over only its pipes, with no
child: to the supervisor it is a sidecar it cannot signal, restarted by opening again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from client_support import RATE, expected
from harness import Peer, spawn

from indextts_client import CrashedError, RestartLimitError, StartError
from indextts_client._supervision._settings import SidecarSettings
from indextts_client._supervision._supervisor import Supervisor
from indextts_client._supervision._transports import Link, Transport

pytestmark = pytest.mark.anyio

_ENGINE_ARGS = ("-o", f"sample_rate={RATE}", "-o", "seconds_per_char=0.01")


class _Recorded(Transport):
    """Spawns a fake sidecar per open(), unless told to refuse; records each open and release."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = 0
        self.released: list[anyio.Event] = []
        self.refuse = False
        self.peer: Any = None

    @asynccontextmanager
    async def open(self, settings: SidecarSettings) -> AsyncIterator[Link]:
        self.opened += 1
        if self.refuse:
            raise StartError(f"refused open #{self.opened}")
        released = anyio.Event()
        self.released.append(released)
        try:
            async with spawn("fake", *_ENGINE_ARGS) as peer:
                assert isinstance(peer, Peer)
                self.peer = peer
                yield Link(peer.stdout, peer.stdin, None)
        finally:
            released.set()


def _settings(**changes: Any) -> SidecarSettings:
    return SidecarSettings(**{"restart_backoff": 0.0, "ready_timeout": 20.0, **changes})


async def test_each_session_opens_the_transport_once_and_releases_it_when_it_ends() -> None:
    transport = _Recorded()
    supervisor = Supervisor(transport, _settings())
    with anyio.fail_after(60):
        await supervisor.start()
        try:
            first = await supervisor.connection()
            assert (await first.synthesize("ab")).samples.tobytes() == expected("ab")
            assert transport.opened == 1 and supervisor.restarts == 0
            transport.peer.process.kill()
            await first.closed_event.wait()
            assert isinstance(first.error, CrashedError)
            await transport.released[0].wait()
            second = await supervisor.connection()  # the next call restarts: a second open()
            assert second is not first
            assert (await second.synthesize("cde")).samples.tobytes() == expected("cde")
            assert transport.opened == 2 and supervisor.restarts == 1
            assert not transport.released[1].is_set()
        finally:
            await supervisor.aclose()
        assert transport.released[1].is_set()
        assert transport.opened == 2


async def test_failed_opens_spend_the_restart_budget_and_a_revive_starts_it_afresh() -> None:
    transport = _Recorded()
    supervisor = Supervisor(transport, _settings(max_restarts=2))
    with anyio.fail_after(60):
        await supervisor.start()
        try:
            first = await supervisor.connection()
            transport.refuse = True
            transport.peer.process.kill()
            await first.closed_event.wait()
            for attempt in (2, 3):
                with pytest.raises(StartError, match=f"refused open #{attempt}"):
                    await supervisor.connection()
            with pytest.raises(RestartLimitError) as dead:
                await supervisor.connection()
            assert transport.opened == 3  # the spent budget opened nothing more
            assert "failed 3 times within 60 s (max_restarts=2)" in dead.value.message
            assert isinstance(dead.value.last_error, StartError)
            assert supervisor.dead is not None and supervisor.dead_at is not None
            assert supervisor.restarts == 2

            transport.refuse = False
            await supervisor.revive()
            assert supervisor.dead is None and supervisor.dead_at is None
            assert supervisor.restarts == 3 and transport.opened == 4
            revived = await supervisor.connection()
            assert (await revived.synthesize("f")).samples.tobytes() == expected("f")
        finally:
            await supervisor.aclose()
