"""client.restart() and client.is_alive(), against real sidecar processes."""

from __future__ import annotations

import anyio
import pytest
from client_support import expected, fake_client

from indextts_client import ClosedError, CrashedError, RequestCancelledError, RestartLimitError

pytestmark = pytest.mark.anyio


async def test_restart_replaces_the_sidecar_and_ends_its_pending_requests() -> None:
    with anyio.fail_after(30):
        client = fake_client()
        assert not client.is_alive()
        async with client:
            assert client.is_alive()
            await client.load()
            first = client.pid
            failures: list[BaseException] = []

            async def hang() -> None:
                try:
                    await client.synthesize("hang", hang_at=0)
                except (RequestCancelledError, ClosedError) as exc:
                    failures.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(hang)
                while (await client.ping()).active is None:  # the hanging request is running
                    await anyio.wait_all_tasks_blocked()
                await client.restart()
            assert len(failures) == 1
            assert client.pid != first and client.is_alive()
            assert client.restarts == 0  # explicit restarts are not the supervisor's
            health = await client.ping()
            assert not health.loaded and health.uptime < 10  # a new process, model not loaded
            assert (await client.synthesize("after")).samples.tobytes() == expected("after")
        assert not client.is_alive()
        with pytest.raises(ClosedError):
            await client.restart()


async def test_is_alive_turns_false_on_a_crash_and_restart_revives_a_dead_client() -> None:
    with anyio.fail_after(30):
        async with fake_client(max_restarts=0) as client:
            with pytest.raises(CrashedError):
                await client.synthesize("boom", crash_at=0)
            assert not client.is_alive()
            with pytest.raises(RestartLimitError):
                await client.ping()
            assert client.dead and not client.is_alive()
            await client.restart()
            assert client.is_alive() and not client.dead
            assert (await client.synthesize("back")).samples.tobytes() == expected("back")


async def test_restart_before_start_is_refused() -> None:
    client = fake_client()
    with pytest.raises(RuntimeError, match="not started"):
        await client.restart()
