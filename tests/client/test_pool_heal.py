"""Pool healing: a dead member comes back after its window, local or remote; real sidecars."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from harness import listening_process

from indextts_client import ClosedError, MemberHealth, Pool, RestartLimitError
from indextts_sidecar.engines.fake import render_bytes

pytestmark = pytest.mark.anyio

TIMEOUT = 60
TOKEN = "heal-token-0123456789abcdef"
QUIET = ["--log-level", "ERROR"]


@asynccontextmanager
async def listening(directory: Path) -> AsyncIterator[Process]:
    """A sidecar listening on ``directory/s.sock``; yields once it listens; reaped after."""
    (directory / "token").write_text(TOKEN + "\n")
    (directory / "voices").mkdir(exist_ok=True)
    command = [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", *QUIET]
    command += ["--listen", f"unix://{directory}/s.sock", "--token-file", str(directory / "token")]
    command += ["--voice-dir", str(directory / "voices")]
    async with listening_process(command, stderr=subprocess.DEVNULL) as (process, _):
        yield process


async def wait_for_state(p: Pool, index: int, state: str) -> MemberHealth:
    """Poll ``health()`` until member ``index`` is in ``state`` (the caller bounds the wait)."""
    while True:
        report = (await p.health())[index]
        if report.state == state:
            return report
        await anyio.sleep(0.05)


async def test_a_dead_local_member_is_revived_after_its_window_and_serves_again() -> None:
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", size=2, max_restarts=0, revive_after=0.5, sidecar_args=QUIET) as p:
            victim = p.members[0]
            first_pid = victim.pid
            assert first_pid is not None
            os.kill(first_pid, signal.SIGKILL)
            # Requests go on (retried on member 1) until the pool has seen member 0 die.
            while not victim.dead:
                audio = await p.synthesize("during")
                assert audio.samples.tobytes() == render_bytes("during")
            dead = (await p.health())[0]
            assert dead.state == "dead"
            assert dead.retry_in is not None and 0.0 <= dead.retry_in <= 0.5
            assert dead.error is not None and dead.error.startswith("RestartLimitError")
            assert (await p.health())[1].retry_in is None
            # Capacity comes back without restarting the pool.
            revived = await wait_for_state(p, 0, "ready")
            assert revived.retry_in is None and revived.restarts == 1
            assert revived.pid not in (None, first_pid)
            served_before = revived.served
            results = []

            async def one(i: int) -> None:
                results.append((await p.synthesize(f"back {i}")).samples.tobytes() == render_bytes(f"back {i}"))

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
            assert results == [True] * 8
            assert (await p.health())[0].served > served_before


async def test_a_remote_member_whose_sidecar_comes_back_is_used_again(sockdir: Path) -> None:
    url = f"unix://{sockdir}/s.sock"
    with anyio.fail_after(TIMEOUT):
        async with listening(sockdir) as remote:
            p = Pool(
                "fake",
                size=1,
                urls=[url],
                token=TOKEN,
                max_restarts=1,
                restart_backoff=0.0,
                revive_after=0.3,
                sidecar_args=QUIET,
            )
            async with p:
                assert [h.state for h in await p.health()] == ["ready", "ready"]
                remote.kill()
                await remote.wait()
                # While it is down, requests land on member 0; member 1 spends its budget.
                member = p.members[1]
                while not member.dead:
                    audio = await p.synthesize("meanwhile")
                    assert audio.samples.tobytes() == render_bytes("meanwhile")
                # Nothing listens: the first revival fails, and the wait doubles.
                failed = await _wait_for_failed_revival(p)
                assert failed.retry_in is not None and 0.0 < failed.retry_in <= 0.6 + 0.05
                assert failed.error is not None and "could not be revived" in failed.error
                async with listening(sockdir):
                    back = await wait_for_state(p, 1, "ready")
                    assert back.url == url
                    served_before = back.served
                    for i in range(8):
                        audio = await p.synthesize(f"back {i}")
                        assert audio.samples.tobytes() == render_bytes(f"back {i}")
                    assert (await p.health())[1].served > served_before


async def _wait_for_failed_revival(p: Pool) -> MemberHealth:
    while True:
        report = (await p.health())[1]
        if report.error is not None and "could not be revived" in report.error:
            return report
        await anyio.sleep(0.05)


async def test_every_member_dead_says_when_the_next_revival_is() -> None:
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", size=1, max_restarts=0, revive_after=30.0, sidecar_args=QUIET) as p:
            pid = p.members[0].pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(RestartLimitError):
                await p.synthesize("one")  # crashed, then past its limit on the retry
            with pytest.raises(RestartLimitError, match=r"next revival is in (29|30)\.\d s"):
                await p.synthesize("two")
            report = (await p.health())[0]
            assert report.state == "dead" and report.retry_in is not None and 29.0 < report.retry_in <= 30.0


async def test_ping_after_aclose_raises_closed() -> None:
    with anyio.fail_after(TIMEOUT):
        p = Pool("fake", size=2, sidecar_args=QUIET)
        async with p:
            assert len(await p.ping()) == 2
        with pytest.raises(ClosedError):
            await p.ping()


def test_revive_after_must_be_positive() -> None:
    for bad in ({"revive_after": 0.0}, {"revive_after": 5.0, "max_revive_after": 1.0}):
        kwargs: dict[str, Any] = dict(bad)
        with pytest.raises(ValueError, match="revive_after"):
            Pool("fake", size=1, **kwargs)


async def test_six_sigkills_of_one_member_fail_none_of_a_hundred_requests_with_two_retries() -> None:
    """The issue's run: 1 of 100 failed CrashedError.  Each crash costs its requests one retry."""
    with anyio.fail_after(TIMEOUT * 2):
        async with Pool("fake", size=2, retries=2, max_restarts=100, restart_backoff=0.0, sidecar_args=QUIET) as p:
            # 10 chunks, 30 ms each: about 0.3 s a request, so a hundred outlast six restarts.
            options: dict[str, Any] = {"seconds": 1, "chunk_seconds": 0.1, "delay": 0.03}
            results: dict[int, bool] = {}
            failures: list[BaseException] = []
            finished = anyio.Event()
            kills = 0

            async def one(i: int) -> None:
                try:
                    audio = await p.synthesize(f"request {i}", **options)
                except Exception as exc:
                    failures.append(exc)
                else:
                    results[i] = audio.samples.tobytes() == render_bytes(f"request {i}", seconds=1)

            async def killer() -> None:
                # Kill member 0 each time it is up again with requests in flight.
                nonlocal kills
                member, last = p._router.members[0], None
                while kills < 6 and not finished.is_set():
                    pid = member.client.pid
                    if pid is not None and pid != last and member.outstanding and member.client.is_alive():
                        os.kill(pid, signal.SIGKILL)
                        kills, last = kills + 1, pid
                    await anyio.sleep(0.01)

            async with anyio.create_task_group() as tg:
                tg.start_soon(killer)
                async with anyio.create_task_group() as requests:
                    for i in range(100):
                        requests.start_soon(one, i)
                finished.set()
            assert failures == []
            assert results == dict.fromkeys(range(100), True)
            assert kills == 6, kills
            assert [h.restarts for h in await p.health()] == [6, 0]
