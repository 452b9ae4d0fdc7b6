"""The WebSocket route against hostile clients (issue 32): admission only after the key,
a client that pings and never reads, deep JSON, text sent to a context that has just failed,
and a foreign ``Origin``.  A real server, the `websockets` package's client and raw sockets."""

from __future__ import annotations

import base64
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from http_support import AUTH, KEY, TIMEOUT, Server, server
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from ws_support import WAIT, Socket, session, url

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the websockets client runs on asyncio


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    with server("--engine", "fake", "--api-key", KEY) as s:
        yield s


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _closed(raw: ClientConnection) -> ConnectionClosed:
    """How the server ended the connection, after whatever it sent before."""
    with anyio.fail_after(WAIT):
        while True:
            try:
                await raw.recv()
            except ConnectionClosed as exc:
                return exc


def _deep(levels: int) -> str:
    return '{"type": "context.config", "context_id": "d", "options": {"x": ' + "[" * levels + "]" * levels + "}}"


async def test_deep_json_is_an_error_event_and_the_connection_stays(srv: Server) -> None:
    async with session(srv, max_size=None) as ws:
        for levels in (30_000, 70):
            await ws.ws.send(_deep(levels))
            error = await ws.next()
            assert isinstance(error, dict) and (error["type"], error["code"]) == ("error", "too_deep"), error
        await ws.send("input.text", context_id="ok", text="Still here.")
        await ws.send("input.done", context_id="ok")
        messages = await ws.until_done("ok")
        assert messages[-1] == {"type": "context.done", "context_id": "ok"}
    # Before the key: refused as any event that is not session.config, without a traceback.
    async with connect(url(srv), open_timeout=WAIT, max_size=None) as raw:
        await raw.send(_deep(30_000))
        closed = await _closed(raw)
        assert closed.rcvd is not None and closed.rcvd.reason == "invalid_api_key"
    assert not any("Traceback" in line for line in srv.log), "".join(srv.log)


async def test_a_connection_takes_a_slot_only_once_it_shows_the_key() -> None:
    args = ("--api-key", KEY, "--ws-max-connections", "1", "--ws-max-unauthenticated", "2", "--ws-auth-timeout", "60")
    with server("--engine", "fake", *args) as s:
        idle = [await connect(url(s), open_timeout=WAIT) for _ in range(2)]  # never send the key
        try:
            with pytest.raises(InvalidStatus) as refused:
                await connect(url(s), open_timeout=WAIT)
            assert refused.value.response.status_code == 503
            async with session(s) as keyed:  # the key in the handshake: the one slot is free
                await keyed.send("input.text", text="Mine.")
                await keyed.send("input.done")
                assert (await keyed.until_done("default"))[-1]["type"] == "context.done"
            # The key in session.config: in once its slot is free again.
            later = Socket(idle[0])
            await later.send("session.config", api_key=KEY)
            assert await later.next() == {"type": "session.ready"}
        finally:
            for ws in idle:
                await ws.close()


async def test_a_connection_that_never_shows_the_key_is_closed_at_its_deadline() -> None:
    with server("--engine", "fake", "--api-key", KEY, "--ws-auth-timeout", "1") as s:
        async with connect(url(s), open_timeout=WAIT) as raw:
            closed = await _closed(raw)
        assert closed.rcvd is not None and (closed.rcvd.code, closed.rcvd.reason) == (1008, "auth_timeout")


def _handshake(s: Server) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(s.host_port)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /v1/audio/speech/stream HTTP/1.1\r\nHost: {s.base.removeprefix('http://')}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def test_pings_from_a_client_that_never_reads_do_not_grow_the_server() -> None:
    # A masked ping with 125 bytes of payload (a zero mask leaves it as it is): its pong is 127 bytes.
    ping = bytes([0x89, 0x80 | 125]) + bytes(4) + b"p" * 125
    block = ping * 8000  # 1 MB of pings
    with server("--engine", "fake", "--api-key", KEY, "--ws-auth-timeout", "60") as s:
        before = _rss(s.process.pid)
        sock = _handshake(s)
        sock.settimeout(TIMEOUT)
        sent = 0
        try:
            while sent < 128 * 2**20:
                sock.sendall(block)
                sent += len(block)
        except OSError:
            pass  # reset by the server: what we hoped for
        finally:
            sock.close()
        grown = _rss(s.process.pid) - before
        assert sent < 128 * 2**20, "the server took 128 MB of pings without resetting the connection"
        assert grown < 32 * 2**20, f"the server grew {grown / 2**20:.0f} MB"
        import httpx

        assert httpx.get(s.base + "/health", timeout=TIMEOUT).status_code == 200


async def test_text_for_a_context_that_just_failed_never_drops_the_connection(srv: Server) -> None:
    for _ in range(4):
        async with session(srv) as ws:
            await ws.send("session.config", options={"fail_at": 0})
            for _ in range(200):  # every context opened for this text fails at once
                await ws.send("input.text", context_id="f", text="Words. ")
            await ws.send("context.config", context_id="good", options={})
            await ws.send("input.text", context_id="good", text="Still here.")
            await ws.send("input.done", context_id="good")
            seen: list[str] = []
            while True:
                item = await ws.next()
                if isinstance(item, dict):
                    seen.append(str(item.get("code") or item["type"]))
                    if item.get("context_id") == "good" and item["type"] in ("context.done", "error"):
                        break
            assert seen[-1] == "context.done", seen
            assert "engine_error" in seen
            assert set(seen) <= {
                "engine_error",
                "context_ended",
                "audio.start",
                "audio.alignment",
                "audio.done",
                "context.done",
            }, seen


async def test_a_foreign_origin_cannot_open_the_socket(srv: Server) -> None:
    with pytest.raises(InvalidStatus) as refused:
        await connect(url(srv), additional_headers={**AUTH, "Origin": "https://evil.example"}, open_timeout=WAIT)
    assert refused.value.response.status_code == 403
    body = json.loads(refused.value.response.body or b"{}")
    assert body["error"]["code"] == "forbidden_origin"


def _extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from harness import REPO

    with open(Path(REPO) / "pyproject.toml", "rb") as file:
        extras: dict[str, list[str]] = tomllib.load(file)["project"]["optional-dependencies"]
    return extras


def test_the_server_extra_brings_what_the_websocket_route_imports() -> None:
    """``pip install ".[server]"`` alone runs the route: its sentence splitter comes with it."""
    extras = _extras()
    server_extra = extras["server"]
    brought = set(server_extra)
    for requirement in server_extra:  # the extras it names of this package
        if requirement.startswith("indextts-sidecar["):
            for name in requirement[len("indextts-sidecar[") : -1].split(","):
                brought.update(extras[name])
    assert any(requirement.startswith("sentence-stream") for requirement in brought), server_extra
