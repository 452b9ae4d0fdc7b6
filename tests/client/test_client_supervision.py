"""Supervision: crashes fail pending requests at once, the next call respawns, within a budget."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from client_support import LEAKY, assert_gone, expected, fake_client, script_client

from indextts_client import (
    Audio,
    CrashedError,
    RestartLimitError,
    SidecarError,
    StartError,
)

pytestmark = pytest.mark.anyio


async def test_crash_fails_every_pending_request_at_once_and_the_next_call_respawns() -> None:
    restarts: list[tuple[int, BaseException]] = []
    results: dict[str, Any] = {}
    with anyio.fail_after(20):
        async with fake_client(on_restart=lambda attempt, reason: restarts.append((attempt, reason))) as client:
            await client.load()
            first_pid = client.pid
            # One request crashes the sidecar after its first chunk; two wait behind it.
            crashing = client.request("crash", crash_at=1, chunk_seconds=0.01, delay=0.05)
            queued = [client.request(f"queued {i}") for i in range(2)]
            for req in (crashing, *queued):
                await req.start()

            async def wait(name: str, req: Any) -> None:
                try:
                    results[name] = await req.result()
                except SidecarError as exc:
                    results[name] = (exc, time.monotonic())

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait, "crash", crashing)
                for i, req in enumerate(queued):
                    tg.start_soon(wait, f"queued {i}", req)
            failed_at = [at for _exc, at in results.values()]
            assert max(failed_at) - min(failed_at) < 1.0, "all pending requests fail together"
            for exc, _at in results.values():
                assert isinstance(exc, CrashedError)
                assert exc.exit_code == 70
                assert exc.signal is None
                assert "crashing with exit code 70 as asked" in exc.stderr_tail
                assert "exited with code 70" in str(exc)
            assert restarts == []

            audio = await client.synthesize("respawned")
            assert audio.samples.tobytes() == expected("respawned")
            assert client.pid != first_pid
            assert client.info.pid == client.pid
            assert client.restarts == 1
            assert len(restarts) == 1 and restarts[0][0] == 1
            assert isinstance(restarts[0][1], CrashedError)
        assert_gone(first_pid)
        assert_gone(client.pid)


async def test_killed_by_a_signal() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            await client.load()
            pid = client.pid
            assert pid is not None
            async with client.stream("hang", hang_at=1, chunk_seconds=0.01) as chunks:
                await chunks.__anext__()
                os.kill(pid, signal.SIGKILL)
                with pytest.raises(CrashedError) as caught:
                    await chunks.__anext__()
            assert caught.value.signal == signal.SIGKILL
            assert caught.value.exit_code is None
            assert "SIGKILL" in str(caught.value)
            assert (await client.ping()).queue_depth == 0  # respawned
            assert client.pid != pid


async def test_restart_budget_is_exhausted_then_every_call_fails_fast() -> None:
    attempts: list[int] = []

    async def on_restart(attempt: int, reason: BaseException) -> None:
        assert isinstance(reason, CrashedError)
        attempts.append(attempt)

    with anyio.fail_after(30):
        async with fake_client(max_restarts=2, restart_window=60, on_restart=on_restart) as client:
            for _ in range(3):  # the first sidecar and two restarts all crash
                with pytest.raises(CrashedError):
                    await client.synthesize("crash", crash_at=0)
            assert attempts == [1, 2]
            last_pid = client.pid
            for _ in range(3):
                began = time.monotonic()
                with pytest.raises(RestartLimitError) as caught:
                    await client.synthesize("anything")
                assert time.monotonic() - began < 1
                assert isinstance(caught.value.last_error, CrashedError)
                assert isinstance(caught.value.__cause__, CrashedError)
                assert caught.value.max_restarts == 2
            with pytest.raises(RestartLimitError):
                await client.ping()
            assert client.dead
            assert client.pid == last_pid, "no respawn once dead"
            assert attempts == [1, 2]
        assert_gone(last_pid)


async def test_backoff_between_restarts() -> None:
    with anyio.fail_after(20):
        async with fake_client(restart_backoff=0.3) as client:
            with pytest.raises(CrashedError):
                await client.synthesize("crash", crash_at=0)
            began = time.monotonic()
            await client.ping()
            assert time.monotonic() - began >= 0.25
            with pytest.raises(CrashedError):
                await client.synthesize("crash", crash_at=0)
            began = time.monotonic()
            await client.ping()
            assert time.monotonic() - began >= 0.55  # doubled
            assert client.restarts == 2


async def test_a_failed_restart_counts_against_the_budget(tmp_path: Path) -> None:
    marker = str(tmp_path / "started-once")
    with anyio.fail_after(20):
        client = script_client(
            "import os, sys\n"
            "marker = os.environ['MARKER']\n"
            "if os.path.exists(marker):\n"
            "    sys.stderr.write('second start fails\\n'); sys.exit(9)\n"
            "open(marker, 'w').close()\n"
            "os.execv(sys.executable, [sys.executable, '-m', 'indextts_sidecar', '--engine', 'fake'])\n",
            env={"MARKER": marker},
            max_restarts=2,
        )
        async with client:
            with pytest.raises(CrashedError):
                await client.synthesize("crash", crash_at=0)
            for _ in range(2):
                with pytest.raises(StartError) as caught:
                    await client.ping()
                assert caught.value.exit_code == 9
                assert "second start fails" in caught.value.stderr_tail
            with pytest.raises(RestartLimitError) as limit:
                await client.ping()
            assert isinstance(limit.value.last_error, StartError)


async def test_requests_after_a_crash_do_not_cross() -> None:
    with anyio.fail_after(30):
        async with fake_client() as client:
            results: dict[int, Audio] = {}

            async def run(i: int) -> None:
                results[i] = await client.synthesize(f"text {i}")

            for _round in range(2):
                with pytest.raises(CrashedError):
                    await client.synthesize("crash", crash_at=0)
                async with anyio.create_task_group() as tg:
                    for i in range(20):
                        tg.start_soon(run, i)
                for i in range(20):
                    assert results[i].samples.tobytes() == expected(f"text {i}")
            assert client.restarts == 2


async def test_secrets_are_redacted_from_logs_and_errors(caplog: pytest.LogCaptureFixture) -> None:
    token = "s3cr3t-t0k3n-value"
    password = "hunter2-password"
    hf_token = "hf_" + "a1B2" * 9
    with anyio.fail_after(20):
        client = script_client(LEAKY, env={"MY_API_TOKEN": token, "DB_PASSWORD": password})
        with caplog.at_level(logging.INFO, logger="indextts_client.sidecar"), pytest.raises(StartError) as caught:
            await client.start()
    error = caught.value
    assert error.exit_code == 3
    assert "token *** and *** and *** end" in error.stderr_tail
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "token *** and *** and *** end" in logged
    for secret in (token, password, hf_token):
        assert secret not in error.stderr_tail
        assert secret not in str(error)
        assert secret not in logged
        assert secret not in client.stderr_tail


async def test_ten_megabyte_stderr_flood_does_not_block(caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(30):
        async with fake_client() as client:
            audio = await client.synthesize("flood", stderr_bytes=10_000_000)
            assert audio.samples.tobytes() == expected("flood")
            assert (await client.synthesize("after")).samples.tobytes() == expected("after")
            tail = client.stderr_tail
    assert "fake engine: stderr flood" in tail
    assert len(tail) <= 16 * 1024
    assert tail.count("\n") < 64
