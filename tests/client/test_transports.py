"""The three transports on their own: what each open() yields, and what it releases on exit."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import cast

import anyio
import pytest
from anyio.abc import ByteReceiveStream, ByteSendStream

from indextts_client import StartError
from indextts_client._supervision._process import Redactor
from indextts_client._supervision._settings import SidecarSettings
from indextts_client._supervision._transports import (
    SocketTransport,
    SpawnTransport,
    StreamsTransport,
    child_environment,
    sidecar_command,
)
from indextts_sidecar.protocol.address import parse_url
from indextts_sidecar.protocol.defaults import PARENT_ENV

pytestmark = pytest.mark.anyio

#: Writes the parent pid it was given and a secret from its environment, then echoes stdin until EOF.
_ECHO = """
import os, sys
sys.stdout.write(os.environ.get(%r, "none") + " " + os.environ.get("ECHO_TOKEN", "-") + "\\n")
sys.stdout.flush()
for line in sys.stdin:
    sys.stdout.write(line.upper())
    sys.stdout.flush()
"""


async def _read_line(stream: ByteReceiveStream) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        data += await stream.receive()
    return data


def test_the_command_line_is_the_prefix_the_engine_its_options_and_the_extra_arguments() -> None:
    argv = sidecar_command("fake", {"n": 3, "name": "a b"}, python="/py", command=None, sidecar_args=["--x"])
    assert argv == ["/py", "-m", "indextts_sidecar", "--engine", "fake", "-o", "n=3", "-o", 'name="a b"', "--x"]
    argv = sidecar_command(None, None, python=None, command=[Path("/bin/uv"), "run"], sidecar_args=())
    assert argv == ["/bin/uv", "run"]
    assert sidecar_command(None, None, python=None, command=None, sidecar_args=())[0] == sys.executable
    with pytest.raises(ValueError, match="python or command"):
        sidecar_command(None, None, python="p", command=["c"], sidecar_args=())


def test_the_child_environment_adds_to_this_one_or_replaces_it() -> None:
    assert child_environment({"A": "1"}, inherit_env=False) == {"A": "1"}
    inherited = child_environment({"A": "1"}, inherit_env=True)
    assert inherited["A"] == "1" and inherited["PATH"] == os.environ["PATH"]


async def test_a_spawned_child_talks_over_its_pipes_and_is_killed_and_reaped_on_exit() -> None:
    settings = SidecarSettings(shutdown_timeout=5.0)
    env = child_environment({"ECHO_TOKEN": "tok"}, inherit_env=True)
    transport = SpawnTransport([sys.executable, "-c", _ECHO % PARENT_ENV], env=env, cwd=None, exit_with_parent=True)
    with anyio.fail_after(20):
        async with transport.open(settings) as link:
            child = link.child
            assert child is not None and child.running
            assert await _read_line(link.receive) == f"{os.getpid()} tok\n".encode()
            await link.send.send(b"hello\n")
            assert await _read_line(link.receive) == b"HELLO\n"
        # Still reading stdin when the context ended: the last resort killed it.
        assert child.process.returncode == -signal.SIGKILL
    with pytest.raises(anyio.ClosedResourceError):
        await link.send.send(b"more\n")


async def test_a_spawned_child_is_told_its_parent_only_when_it_should_exit_with_it() -> None:
    transport = SpawnTransport(
        [sys.executable, "-c", _ECHO % PARENT_ENV], env=dict(os.environ), cwd=None, exit_with_parent=False
    )
    with anyio.fail_after(20):
        async with transport.open(SidecarSettings()) as link:
            assert await _read_line(link.receive) == b"none -\n"
            await link.send.aclose()  # EOF: the child exits on its own
            assert link.child is not None
            await link.child.process.wait()
        assert link.child.process.returncode == 0


async def test_a_command_that_cannot_run_is_a_start_error_naming_it_redacted() -> None:
    settings = SidecarSettings(redact=Redactor({}, ["hunter2"]))
    transport = SpawnTransport(["/nonexistent/sidecar-hunter2"], env={}, cwd=None, exit_with_parent=True)
    with (
        anyio.fail_after(10),
        pytest.raises(StartError, match=r"could not spawn the sidecar \(/nonexistent/sidecar-\*\*\*\)"),
    ):
        async with transport.open(settings):
            pytest.fail("opened")


async def test_a_socket_transport_yields_one_stream_each_way_and_closes_it_on_exit() -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "s.sock")
        received: list[bytes] = []
        ended = anyio.Event()
        async with await anyio.create_unix_listener(path) as listener, anyio.create_task_group() as tg:

            async def serve_one() -> None:
                async with await listener.accept() as server_side:
                    await server_side.send(b"hi")
                    try:
                        while True:
                            received.append(await server_side.receive())
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        ended.set()

            tg.start_soon(serve_one)
            with anyio.fail_after(10):
                transport = SocketTransport(parse_url(f"unix://{path}"), ssl_context=None)
                assert transport.url is not None and transport.argv == []
                async with transport.open(SidecarSettings()) as link:
                    assert link.child is None and link.receive is cast(object, link.send)
                    assert await link.receive.receive() == b"hi"
                    await link.send.send(b"ho")
                await ended.wait()
        assert b"".join(received) == b"ho"


async def test_a_socket_nobody_listens_on_is_a_start_error_with_the_address() -> None:
    with tempfile.TemporaryDirectory() as folder:
        transport = SocketTransport(parse_url(f"unix://{folder}/none.sock"), ssl_context=None)
        with anyio.fail_after(10), pytest.raises(StartError, match=r"cannot connect to the sidecar at unix://"):
            async with transport.open(SidecarSettings()):
                pytest.fail("opened")


def test_tls_is_only_for_tcp() -> None:
    import ssl

    with pytest.raises(ValueError, match="ssl_context is for tcp://"):
        SocketTransport(parse_url("unix:///tmp/x.sock"), ssl_context=ssl.create_default_context())


class _Recorder(ByteReceiveStream, ByteSendStream):
    def __init__(self) -> None:
        self.closed = 0

    async def receive(self, max_bytes: int = 65536) -> bytes:
        raise anyio.EndOfStream

    async def send(self, item: bytes) -> None:
        pass

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        self.closed += 1
        if self.closed > 1:
            raise anyio.BrokenResourceError  # a second close of a broken stream may raise: it is quiet


async def test_the_callers_streams_are_yielded_as_given_and_closed_on_exit_even_if_cancelled() -> None:
    receive, send = _Recorder(), _Recorder()
    transport = StreamsTransport(receive, send)
    assert not transport.restartable and transport.url is None and transport.argv == []
    with anyio.fail_after(10):
        with anyio.CancelScope() as scope:
            async with transport.open(SidecarSettings()) as link:
                assert (link.receive, link.send, link.child) == (receive, send, None)
                scope.cancel()
                await anyio.sleep_forever()
        assert receive.closed == 1 and send.closed == 1
        async with transport.open(SidecarSettings()):
            pass
        assert receive.closed == 2 and send.closed == 2
