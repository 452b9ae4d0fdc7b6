"""Client lifecycle against real children: spawn, handshake, shutdown, cleanup."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import anyio
import pytest
from client_support import (
    ENV_REPORT,
    EXIT_EARLY,
    GARBAGE_AFTER_READY,
    GARBAGE_FIRST,
    NEVER_READY,
    PY,
    RATE,
    STUBBORN,
    VERSION_99,
    assert_gone,
    expected,
    fake_client,
    fd_count,
    script_client,
    watch_stderr,
)

from indextts_client import (
    PROTOCOL_VERSION,
    Client,
    ClosedError,
    ProtocolError,
    StartError,
    VersionMismatchError,
)

pytestmark = pytest.mark.anyio


async def test_async_with_ready_info_and_reaped() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            info = client.info
            pid = client.pid
            assert info.engine == "fake"
            assert info.protocol == PROTOCOL_VERSION
            assert info.pid == pid
            assert info.sample_rate == RATE
            assert "fault_injection" in info.capabilities
            assert info.options["sample_rate"] == RATE
            # Its own session and process group: Ctrl-C in our terminal does not reach it.
            assert os.getsid(pid) == pid
            assert os.getpgid(pid) == pid
            audio = await client.synthesize("hi")
            assert audio.samples.tobytes() == expected("hi")
        assert client.closed
        assert_gone(pid)


async def test_explicit_start_and_aclose() -> None:
    with anyio.fail_after(20):
        client = fake_client()
        with pytest.raises(RuntimeError, match="not started"):
            await client.ping()
        await client.start()
        try:
            health = await client.ping()
            assert health.queue_depth == 0
            with pytest.raises(RuntimeError):
                await client.start()
        finally:
            await client.aclose()
        await client.aclose()  # idempotent
        assert_gone(client.pid)
        with pytest.raises(ClosedError):
            await client.synthesize("late")
        with pytest.raises(ClosedError):
            await client.ping()


async def test_engine_options_travel_as_json() -> None:
    with anyio.fail_after(20):
        async with fake_client(engine_options={"chunk_seconds": 0.02}) as client:
            assert client.info.options["chunk_seconds"] == 0.02
            assert any(arg == "chunk_seconds=0.02" for arg in client.argv)
            async with client.stream("abcdefgh") as stream:
                chunks = [chunk async for chunk in stream]
            assert len(chunks) == 4  # 80 ms of audio in 20 ms chunks
            assert b"".join(chunk.samples.tobytes() for chunk in chunks) == expected("abcdefgh")


async def test_env_is_added_to_the_parents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDEXTTS_TEST_PARENT_VAR", "from-parent")
    report = tmp_path / "report.json"
    with anyio.fail_after(20):
        client = Client(
            "fake",
            command=[PY, "-c", ENV_REPORT],
            env={"ENV_REPORT": str(report), "INDEXTTS_TEST_CHILD_VAR": "from-client"},
            cwd=tmp_path,
        )
        async with client:
            assert (await client.synthesize("ok")).samples.tobytes() == render("ok")
    seen = json.loads(report.read_text())
    assert seen["env"]["INDEXTTS_TEST_PARENT_VAR"] == "from-parent"
    assert seen["env"]["INDEXTTS_TEST_CHILD_VAR"] == "from-client"
    assert os.path.samefile(seen["cwd"], tmp_path)


async def test_env_can_replace_the_parents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDEXTTS_TEST_PARENT_VAR", "from-parent")
    report = tmp_path / "report.json"
    with anyio.fail_after(20):
        client = Client(
            "fake",
            command=[PY, "-c", ENV_REPORT],
            env={"ENV_REPORT": str(report), "INDEXTTS_TEST_CHILD_VAR": "only-this"},
            inherit_env=False,
        )
        async with client:
            await client.ping()
    seen = json.loads(report.read_text())
    assert "INDEXTTS_TEST_PARENT_VAR" not in seen["env"]
    assert "PATH" not in seen["env"]
    assert seen["env"]["INDEXTTS_TEST_CHILD_VAR"] == "only-this"
    assert os.path.samefile(seen["cwd"], os.getcwd())


def render(text: str) -> bytes:
    from indextts_sidecar.engines.fake import render_bytes

    return render_bytes(text)


async def test_ready_timeout() -> None:
    with anyio.fail_after(20):
        client = script_client(NEVER_READY, ready_timeout=0.5)
        began = time.monotonic()
        with pytest.raises(StartError, match="ready_timeout") as caught:
            await client.start()
        assert time.monotonic() - began < 5
        assert "never-ready child waiting" in caught.value.stderr_tail
        assert caught.value.exit_code is None
        assert_gone(client.pid)
        await client.aclose()


async def test_exit_before_ready_fails_at_once() -> None:
    with anyio.fail_after(20):
        client = script_client(EXIT_EARLY, ready_timeout=30)
        began = time.monotonic()
        with pytest.raises(StartError) as caught:
            await client.start()
        assert time.monotonic() - began < 5, "must not wait for the ready timeout"
        error = caught.value
        assert type(error) is StartError
        assert error.exit_code == 5
        assert "boom: the config is broken" in error.stderr_tail
        assert "exited with code 5" in str(error)
        assert "boom: the config is broken" in str(error)
        assert_gone(client.pid)


async def test_startup_error_frame_unknown_engine() -> None:
    with anyio.fail_after(20):
        client = Client("no-such-engine", restart_backoff=0)
        with pytest.raises(StartError) as caught:
            await client.start()
        assert caught.value.code == "unknown_engine"
        assert caught.value.exit_code == 2
        assert "no-such-engine" in str(caught.value)


async def test_startup_error_frame_invalid_engine_option() -> None:
    with anyio.fail_after(20):
        client = fake_client(engine_options={"bogus_option": 1})
        with pytest.raises(StartError) as caught:
            await client.start()
        assert caught.value.code == "invalid_option"
        assert "bogus_option" in str(caught.value)


async def test_spawn_failure(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        client = Client("fake", python=tmp_path / "no-such-python")
        with pytest.raises(StartError, match="could not spawn") as caught:
            await client.start()
        assert caught.value.exit_code is None
        # A failed start leaves the client as new: start() may be retried.
        with pytest.raises(StartError):
            await client.start()


async def test_version_mismatch() -> None:
    with anyio.fail_after(20):
        client = script_client(VERSION_99)
        with pytest.raises(VersionMismatchError) as caught:
            await client.start()
        error = caught.value
        assert isinstance(error, StartError)
        assert error.expected == PROTOCOL_VERSION == 1
        assert error.got == 99
        assert "99" in str(error) and "version 1" in str(error)
        assert_gone(client.pid)


async def test_garbage_before_ready() -> None:
    with anyio.fail_after(20):
        client = script_client(GARBAGE_FIRST)
        began = time.monotonic()
        with pytest.raises(StartError, match="before 'ready'"):
            await client.start()
        assert time.monotonic() - began < 10
        assert_gone(client.pid)


async def test_garbage_after_ready_fails_the_request_and_respawns() -> None:
    with anyio.fail_after(20):
        client = script_client(GARBAGE_AFTER_READY)
        async with client:
            first_pid = client.pid
            with pytest.raises(ProtocolError, match="undecodable frame"):
                await client.synthesize("x")
            # The next call respawns: it gets a new child (which misbehaves the same way).
            with pytest.raises(ProtocolError):
                await client.synthesize("y")
            assert client.restarts == 1
            assert client.pid != first_pid
        assert_gone(first_pid)
        assert_gone(client.pid)


async def test_sidecar_stdout_prints_do_not_corrupt_frames() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            audio = await client.synthesize("printing", print_lines=6)
            assert audio.samples.tobytes() == expected("printing")


async def test_caller_cancelled_during_handshake() -> None:
    with anyio.fail_after(20):
        client = script_client(NEVER_READY, ready_timeout=30)
        with watch_stderr("never-ready child waiting") as watcher, anyio.CancelScope() as scope:
            # Cancel as soon as the child is demonstrably running, mid-handshake.
            watcher.callbacks.append(scope.cancel)
            await client.start()
        assert scope.cancelled_caught
        assert watcher.event.is_set()
        assert_gone(client.pid)
        assert not client.closed  # a cancelled start leaves the client new
        await client.aclose()


async def test_caller_cancelled_during_shutdown() -> None:
    with anyio.fail_after(20):
        client = fake_client()
        await client.start()
        await client.synthesize("warm")
        pid = client.pid
        with anyio.CancelScope() as scope:
            scope.cancel()  # already cancelled when aclose() begins
            await client.aclose()
        assert scope.cancelled_caught, "the cancellation is re-raised after the cleanup"
        assert client.closed
        assert_gone(pid)


async def test_stubborn_child_is_killed_even_if_shutdown_is_cancelled() -> None:
    with anyio.fail_after(20):
        client = script_client(STUBBORN, shutdown_timeout=0.3)
        await client.start()
        pid = client.pid
        began = time.monotonic()
        with anyio.move_on_after(0.1) as scope:
            # shutdown ignored (0.3 s), SIGTERM ignored (0.3 s), then SIGKILL.
            await client.aclose()
        elapsed = time.monotonic() - began
        assert scope.cancelled_caught
        assert 0.5 < elapsed < 3
        assert_gone(pid)


async def test_no_fd_leak_over_start_close_cycles() -> None:
    async def cycle() -> None:
        async with fake_client() as client:
            assert (await client.synthesize("fd")).samples.tobytes() == expected("fd")
            await client.ping()

    with anyio.fail_after(30):
        await cycle()  # warm-up: the event loop may open its own descriptors once
        before = fd_count()
        await cycle()
        await cycle()
        assert fd_count() == before


async def test_no_fd_leak_over_crash_and_restart() -> None:
    from indextts_client import CrashedError

    async def cycle() -> None:
        async with fake_client() as client:
            with pytest.raises(CrashedError):
                await client.synthesize("crash", crash_at=0)
            assert (await client.synthesize("ok")).samples.tobytes() == expected("ok")

    with anyio.fail_after(30):
        await cycle()
        before = fd_count()
        await cycle()
        assert fd_count() == before


def test_shared_audio_is_accepted_and_ignored_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"Client\(shared_audio=\.\.\.\) is ignored"):
        client = Client("fake", shared_audio=4 * 1024 * 1024)
    assert "--shared-audio-fd" not in client.argv
