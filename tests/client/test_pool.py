"""Pool: routing, limits that wait, retry on another member; real fake-engine sidecars."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from indextts_client import BusyError, ClosedError, CrashedError, LoadInfo, Pool, ProgressEvent
from indextts_sidecar.engines.fake import render_bytes

pytestmark = pytest.mark.anyio

TIMEOUT = 30
#: Two chunks; with hang_at=1 the request holds its member after reporting chunk 0.
TEXT = "abcdefghij"
HOLD: dict[str, Any] = {"chunk_seconds": 0.3, "hang_at": 1}


def pool(**kwargs: Any) -> Pool:
    kwargs.setdefault("ready_timeout", TIMEOUT)
    return Pool("fake", **kwargs)


async def hold(p: Pool, started: anyio.Event, cancelled: list[BaseException], **options: Any) -> None:
    """A request that occupies a member until its task is cancelled."""

    def on_progress(event: ProgressEvent) -> None:
        if event.stage == "synthesize":
            started.set()

    try:
        await p.synthesize(TEXT, on_progress=on_progress, **HOLD, **options)
    except anyio.get_cancelled_exc_class() as exc:
        cancelled.append(exc)
        raise


async def test_requests_spread_over_members_and_come_back_exact() -> None:
    with anyio.fail_after(TIMEOUT):
        async with pool(size=2, max_outstanding=1) as p:
            results: dict[int, bytes] = {}

            async def one(i: int) -> None:
                audio = await p.synthesize(f"text {i}")
                results[i] = audio.samples.tobytes()

            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(one, i)
            assert results == {i: render_bytes(f"text {i}") for i in range(6)}
            health = await p.health()
            assert [h.state for h in health] == ["ready", "ready"]
            assert [h.outstanding for h in health] == [0, 0]
            assert all(h.served >= 1 for h in health), health
            assert sum(h.served for h in health) == 6
            assert len({h.pid for h in health}) == 2


async def test_when_every_member_is_full_a_request_waits_then_is_busy() -> None:
    with anyio.fail_after(TIMEOUT):
        async with pool(size=2, max_outstanding=1, pool_timeout=0.5) as p:
            cancelled: list[BaseException] = []
            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    started = anyio.Event()
                    tg.start_soon(hold, p, started, cancelled)
                    await started.wait()
                assert [h.outstanding for h in await p.health()] == [1, 1]
                with pytest.raises(BusyError) as busy:
                    await p.synthesize("hello")
                assert busy.value.code == "busy" and "pool_timeout=0.5" in str(busy.value)
                tg.cancel_scope.cancel()
            assert len(cancelled) == 2
            # Room again: served at once.
            audio = await p.synthesize("hello")
            assert audio.samples.tobytes() == render_bytes("hello")


async def test_a_waiting_request_runs_when_room_frees() -> None:
    with anyio.fail_after(TIMEOUT):
        async with pool(size=1, max_outstanding=1, pool_timeout=None) as p:
            cancelled: list[BaseException] = []
            result: list[bytes] = []

            async def waiter() -> None:
                result.append((await p.synthesize("later")).samples.tobytes())

            async with anyio.create_task_group() as tg:
                holder = anyio.CancelScope()

                async def held() -> None:
                    with holder:
                        await hold(p, started, cancelled)

                started = anyio.Event()
                tg.start_soon(held)
                await started.wait()
                tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()
                assert result == []  # waiting for room, not refused
                holder.cancel()
            assert len(cancelled) == 1
            assert result == [render_bytes("later")]


async def test_a_crash_before_audio_reached_the_caller_is_retried_on_another_member(tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    with anyio.fail_after(TIMEOUT):
        async with pool(size=2, max_outstanding=4) as p:
            audio = await p.synthesize(TEXT, crash_at=1, crash_once=str(marker), chunk_seconds=0.3)
            assert marker.exists()
            assert audio.samples.tobytes() == render_bytes(TEXT)
            health = await p.health()
            assert sorted(h.served for h in health) == [0, 1]
            # The crashed member restarts and serves again.
            for _ in range(2):
                await p.synthesize("again")
            assert sum(h.restarts for h in await p.health()) == 1


async def test_a_stream_moves_only_before_its_first_chunk(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with pool(size=2, max_outstanding=4) as p:
            # Crash before chunk 0: nothing delivered, so the stream moves and completes.
            marker = tmp_path / "first"
            async with p.stream(TEXT, crash_at=0, crash_once=str(marker), chunk_seconds=0.3) as chunks:
                received = b"".join([chunk.samples.tobytes() async for chunk in chunks])
            assert received == render_bytes(TEXT)
            # Crash after a chunk reached the caller: a typed error, no silent duplicate.
            # (The member is killed once chunk 0 arrived: with crash_at=1 the process
            # could exit before its writer had sent chunk 0, and the stream would move.)
            delivered: list[bytes] = []

            async def consume() -> None:
                async with p.stream(TEXT, hang_at=1, chunk_seconds=0.3) as chunks:
                    async for chunk in chunks:
                        delivered.append(chunk.samples.tobytes())
                        busy = [h.pid for h in await p.health() if h.outstanding]
                        assert len(busy) == 1 and busy[0] is not None
                        os.kill(busy[0], signal.SIGKILL)

            with pytest.raises(CrashedError):
                await consume()
            assert delivered == [render_bytes(TEXT)[: len(delivered[0])]]


async def test_voice_affinity_prefers_the_warm_member(tmp_path: Path) -> None:
    voices = []
    for name in ("alice", "bob"):
        path = tmp_path / f"{name}.wav"
        path.write_bytes(b"RIFF voice")
        voices.append(str(path))
    with anyio.fail_after(TIMEOUT):
        async with pool(size=3, max_outstanding=4) as p:
            await p.synthesize("one", voice=voices[0])
            first = [h.served for h in await p.health()]
            warm = first.index(1)
            for _ in range(3):
                await p.synthesize("again", voice=voices[0])
            served = [h.served for h in await p.health()]
            assert served[warm] == 4 and sum(served) == 4
            # Another voice goes to a cold member; the warm one stays free for its voice.
            await p.synthesize("other", voice=voices[1])
            after = [h.served for h in await p.health()]
            assert after[warm] == 4 and sum(after) == 5


async def test_a_dead_member_is_skipped() -> None:
    with anyio.fail_after(TIMEOUT):
        async with pool(size=2, max_restarts=0) as p:
            victim = p.members[0]
            assert victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)
            # The pool notices the death on its first try there, retries elsewhere, and from
            # then on routes around it.
            for i in range(4):
                audio = await p.synthesize(f"after {i}")
                assert np.array_equal(audio.samples, np.frombuffer(render_bytes(f"after {i}"), "<i2"))
            states = [h.state for h in await p.health()]
            assert states == ["dead", "ready"]


async def test_devices_pin_each_member(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with pool(devices=["cuda:3", "cpu"]) as p:
            pids = [c.pid for c in p.members]
            assert all(pids)
            environ = [Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for pid in pids if pid]
            assert b"CUDA_VISIBLE_DEVICES=3" in environ[0]
            assert b"CUDA_VISIBLE_DEVICES=" in environ[1]
            assert [h.device for h in await p.health()] == ["cuda:3", "cpu"]


async def test_a_pool_used_before_start_says_so() -> None:
    p = pool(size=1)
    with pytest.raises(RuntimeError, match=r"pool is not started: use 'async with Pool"):
        await p.synthesize("hi")
    await p.aclose()
    with pytest.raises(ClosedError):
        await p.synthesize("hi")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="device"):
        Pool("fake", devices=["gpu0"])
    with pytest.raises(ValueError, match="size"):
        Pool("fake", size=3, devices=["cuda:0"])
    with pytest.raises(ValueError, match="at least one"):
        Pool("fake", size=0)


async def test_a_client_with_pool_timeout_waits_for_room_instead_of_busy() -> None:
    """12 concurrent requests on one client, a sidecar queue of 2: busy at once, or all served."""
    from indextts_client import Client

    texts = [f"t{i}" for i in range(12)]
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", sidecar_args=["--max-queue", "2"], ready_timeout=TIMEOUT) as plain:
            outcomes: list[str] = []

            async def one(client: Client, text: str) -> None:
                try:
                    audio = await client.synthesize(text, delay=0.2)  # all 12 are sent long before one ends
                    outcomes.append("ok" if audio.samples.tobytes() == render_bytes(text) else "wrong")
                except BusyError:
                    outcomes.append("busy")

            async with anyio.create_task_group() as tg:
                for text in texts:
                    tg.start_soon(one, plain, text)
            assert outcomes.count("busy") >= 1 and "wrong" not in outcomes

        async with Client("fake", sidecar_args=["--max-queue", "2"], pool_timeout=TIMEOUT) as waiting:
            outcomes = []
            async with anyio.create_task_group() as tg:
                for text in texts:
                    tg.start_soon(one, waiting, text)
            assert outcomes == ["ok"] * len(texts)


async def test_a_pool_stream_outside_async_with_is_refused_not_silently_empty() -> None:
    with anyio.fail_after(30):
        async with Pool("fake", size=1) as pool:
            with pytest.raises(RuntimeError, match=r"inside 'async with pool\.stream"):
                async for _chunk in pool.stream("abc"):
                    pass
            infos = await pool.load()
            assert [(type(info), info.loaded) for info in infos] == [(LoadInfo, True)]


async def test_a_pool_stream_tells_the_engine_it_streams_and_a_pool_synthesize_does_not(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with Pool("fake", size=1, ready_timeout=TIMEOUT) as pool:
            async with pool.stream("abc", record=str(tmp_path / "s.json")) as chunks:
                assert b"".join([chunk.samples.tobytes() async for chunk in chunks]) == render_bytes("abc", 24000)
            await pool.synthesize("abc", record=str(tmp_path / "w.json"))
    streamed, whole = (json.loads((tmp_path / name).read_bytes())["stream"] for name in ("s.json", "w.json"))
    assert (streamed, whole) == (True, False)


async def test_a_lease_holds_its_member_as_one_request_in_flight() -> None:
    # Pool.lease is how stream_text holds its member (it reached into _acquire/_release before).
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", size=1, max_outstanding=1, pool_timeout=0.2, ready_timeout=TIMEOUT) as pool:
            async with pool.lease("alice") as lease:
                assert (lease.index, lease.client) == (0, pool.members[0])
                with pytest.raises(BusyError):
                    await pool.synthesize("no room")
                audio = await lease.client.synthesize("on the lease")
            assert audio.samples.tobytes() == render_bytes("on the lease")
            assert (await pool.synthesize("room again")).samples.tobytes() == render_bytes("room again")
            (health,) = await pool.health()
            assert (health.outstanding, health.served) == (0, 2)
