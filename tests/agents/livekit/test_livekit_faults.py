"""The LiveKit TTS when the server misbehaves: a scripted WebSocket peer (aiohttp's server, in
process) for what a real server does not do, and a real ``serve`` that closes idle sockets."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

pytest.importorskip("livekit.agents")

from aiohttp import web
from http_support import KEY, server
from livekit.agents import APIConnectionError, APIConnectOptions, APIError, APITimeoutError
from livekit_support import WAIT, recording_session

from indextts_client.integrations.livekit import TTS

pytestmark = pytest.mark.anyio

Script = Callable[[web.WebSocketResponse, str], Awaitable[None]]
NO_RETRY = APIConnectOptions(max_retry=0, timeout=WAIT)


@asynccontextmanager
async def peer(script: Script, *, ready: bool = True) -> AsyncIterator[str]:
    """A route that says ``session.ready`` (with ``ready``) and runs ``script`` at each ``input.done``."""

    async def route(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        if ready:
            await ws.send_json({"type": "session.ready"})
        async for message in ws:
            event = json.loads(message.data)
            if event["type"] == "input.done":
                await script(ws, event["context_id"])
        return ws

    app = web.Application()
    app.router.add_get("/v1/audio/speech/stream", route)
    runner = web.AppRunner(app)
    await runner.setup()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    try:
        await web.SockSite(runner, listener).start()
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        await runner.cleanup()
        listener.close()


def frame(context: str, pcm: bytes) -> bytes:
    return bytes([len(context)]) + context.encode() + pcm


async def speak(url: str, conn_options: APIConnectOptions = NO_RETRY) -> list[Any]:
    speaker = TTS(url=url)
    try:
        async with speaker.stream(conn_options=conn_options) as stream:
            stream.push_text("Hello there.")
            stream.end_input()
            return [ev async for ev in stream]
    finally:
        await speaker.aclose()


async def test_malformed_word_times_are_an_api_error_not_a_crash() -> None:
    async def script(ws: web.WebSocketResponse, context: str) -> None:
        await ws.send_json({"type": "audio.start", "context_id": context, "sentence": 0, "text": "Hello there."})
        await ws.send_bytes(frame(context, b"\0\1" * 2400))
        words = [{"word": "Hello", "start": "soon", "end": 0.3, "char_start": 0, "char_end": 5}]
        await ws.send_json({"type": "audio.alignment", "context_id": context, "sentence": 0, "words": words})

    async with peer(script) as url:
        with anyio.fail_after(WAIT), pytest.raises(APIError, match="not a number of seconds") as caught:
            await speak(url)
    assert not caught.value.retryable


async def test_a_connection_closed_mid_reply_is_a_connection_error() -> None:
    async def script(ws: web.WebSocketResponse, context: str) -> None:
        await ws.send_json({"type": "audio.start", "context_id": context, "sentence": 0, "text": "Hello there."})
        await ws.send_bytes(frame(context, b"\0\1" * 2400))
        await ws.close()

    async with peer(script) as url:
        with anyio.fail_after(WAIT), pytest.raises(APIConnectionError):
            await speak(url)


async def test_a_server_silent_after_the_input_is_a_timeout() -> None:
    async def script(ws: web.WebSocketResponse, context: str) -> None:
        pass  # never answers

    async with peer(script) as url:
        with anyio.fail_after(WAIT), pytest.raises(APITimeoutError):
            await speak(url, APIConnectOptions(max_retry=0, timeout=0.5))


async def test_no_session_ready_is_a_timeout() -> None:
    async def script(ws: web.WebSocketResponse, context: str) -> None:
        raise AssertionError("no input expected")

    async with peer(script, ready=False) as url:
        with anyio.fail_after(WAIT), pytest.raises(APITimeoutError):
            await speak(url, APIConnectOptions(max_retry=0, timeout=0.5))


async def test_a_socket_the_server_closed_when_idle_is_opened_again() -> None:
    http, traffic = recording_session()
    with server("--engine", "fake", "--api-key", KEY, "--ws-idle-timeout", "1") as running:
        speaker = TTS(url=running.base, api_key=KEY, http_session=http)
        try:
            with anyio.fail_after(WAIT):
                for _turn in range(2):
                    async with speaker.stream() as stream:
                        stream.push_text("Hello there.")
                        stream.end_input()
                        assert [ev async for ev in stream]
                    # the server closes the idle socket (an error event, then the close)
                    await traffic.until(lambda item: isinstance(item, dict) and item.get("code") == "idle_timeout")
        finally:
            await speaker.aclose()
            await http.close()
    events = [item for item in traffic.received() if isinstance(item, dict)]
    assert [e["type"] for e in events].count("session.ready") == 2
    assert [e["type"] for e in events].count("context.done") == 2
