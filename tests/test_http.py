"""The OpenAI-compatible endpoint: a real server process (uvicorn) and a real HTTP client (httpx)."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import wave
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from indextts_sidecar.engines.fake import render_bytes  # noqa: E402

pytestmark = pytest.mark.anyio

TIMEOUT = 60
KEY = "test-key-1234"
AUTH = {"Authorization": f"Bearer {KEY}"}
RATE = 24000  # the fake engine's default rate, and OpenAI's pcm rate


@contextmanager
def server(*args: str) -> Iterator[str]:
    """``python -m indextts_client.http`` on a loopback socket bound here; yields its base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    command = [sys.executable, "-m", "indextts_client.http", "--fd", str(listener.fileno()), *args]
    process = subprocess.Popen(command, pass_fds=[listener.fileno()], stderr=subprocess.DEVNULL)
    listener.close()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:  # pragma: no cover - the server ignored SIGTERM
            process.kill()
            process.wait()


@asynccontextmanager
async def ready(base: str) -> AsyncIterator[Any]:
    """An httpx client, once /health says 200.

    The socket is bound before the server starts, so the first request waits in its
    backlog until uvicorn has run the app's start-up (the pool's sidecars are ready).
    """
    async with httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        with anyio.fail_after(TIMEOUT):
            health = await http.get("/health")
        assert health.status_code == 200, health.text
        yield http


def speech(**body: Any) -> dict[str, Any]:
    return {"model": "indextts", "voice": "alloy", **body}


async def test_wav_pcm_flac_and_the_other_routes() -> None:
    with server("--engine", "fake", "--api-key", KEY) as base:
        async with ready(base) as http:
            wav = await http.post("/v1/audio/speech", json=speech(input="hello there"), headers=AUTH)
            assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav"
            assert wav.content[:4] == b"RIFF" and wav.content[8:12] == b"WAVE"
            assert wav.content[44:] == render_bytes("hello there")

            pcm = await http.post(
                "/v1/audio/speech", json=speech(input="hello there", response_format="pcm"), headers=AUTH
            )
            assert pcm.status_code == 200
            # Raw 24 kHz s16le: the length is the duration at 24 kHz.
            assert len(pcm.content) == len(render_bytes("hello there"))

            flac = await http.post(
                "/v1/audio/speech", json=speech(input="hello there", response_format="flac"), headers=AUTH
            )
            if flac.status_code == 200:
                soundfile = pytest.importorskip("soundfile")
                samples, rate = soundfile.read(io.BytesIO(flac.content), dtype="int16")
                assert rate == RATE and samples.tobytes() == render_bytes("hello there")
            else:
                assert flac.status_code == 400 and flac.json()["error"]["code"] == "unsupported_format"

            models = await http.get("/v1/models", headers=AUTH)
            assert models.json()["data"][0]["id"] == "indextts"
            health = (await http.get("/health")).json()
            assert health["status"] == "ok" and health["members"][0]["state"] == "ready"
            metrics = (await http.get("/metrics")).text
            assert 'indextts_requests_total{outcome="200"}' in metrics

            for bad, param in (
                (speech(input=""), "input"),
                (speech(input="hi", response_format="mp3"), "response_format"),
                (speech(input="hi", speed=2.0), "speed"),  # the fake engine has no speed
            ):
                answer = await http.post("/v1/audio/speech", json=bad, headers=AUTH)
                assert answer.status_code == 400, answer.text
                assert answer.json()["error"]["param"] == param


async def test_pcm_at_24_khz_whatever_the_engine_rate() -> None:
    with server("--engine", "fake", "-o", "sample_rate=16000") as base:
        async with ready(base) as http:
            pcm = await http.post("/v1/audio/speech", json=speech(input="abcd", response_format="pcm"))
            assert pcm.status_code == 200
            native = len(render_bytes("abcd", 16000)) // 2
            assert len(pcm.content) // 2 == -(-native * 3 // 2)  # ceil(n * 24000 / 16000)
            wav = await http.post("/v1/audio/speech", json=speech(input="abcd"))
            with wave.open(io.BytesIO(wav.content)) as w:
                assert w.getframerate() == 16000


async def test_api_key_is_required_on_v1_routes() -> None:
    with server("--engine", "fake", "--api-key", KEY) as base:
        async with ready(base) as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                answer = await http.post("/v1/audio/speech", json=speech(input="hi"), headers=headers)
                assert answer.status_code == 401
                assert answer.json()["error"]["code"] == "invalid_api_key"
            assert (await http.get("/v1/models")).status_code == 401


async def test_streaming_and_sse() -> None:
    with server("--engine", "fake") as base:
        async with ready(base) as http:
            body = speech(input="abcdefghij", stream_format="audio", options={"chunk_seconds": 0.2})
            parts = []
            async with http.stream("POST", "/v1/audio/speech", json=body) as response:
                assert response.status_code == 200
                async for part in response.aiter_bytes():
                    parts.append(part)
            received = b"".join(parts)
            assert received[:4] == b"RIFF" and received[44:] == render_bytes("abcdefghij")

            events = []
            async with http.stream("POST", "/v1/audio/speech", json=speech(input="abc", stream_format="sse")) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
            assert [e["type"] for e in events][-1] == "speech.audio.done"
            audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
            assert audio[44:] == render_bytes("abc")


#: Chunk 0 arrives, then the sidecar holds the request until it is cancelled.
HELD = speech(input="abcdefghij", options={"chunk_seconds": 0.2, "hang_at": 1})


@asynccontextmanager
async def held_open(base: str) -> AsyncIterator[bytes]:
    """POST ``HELD`` over a plain TCP connection and yield what arrived up to the first audio;
    leaving closes the connection: the client disconnects mid-stream.

    (A plain socket, because httpx cannot stop reading a stream half-way on trio without
    leaking its async generators.)
    """
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps(HELD).encode()
    request = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    async with await anyio.connect_tcp(host, int(port)) as connection:
        await connection.send(request)
        received = b""
        with anyio.fail_after(TIMEOUT):
            while b"RIFF" not in received or len(received) - received.index(b"RIFF") < 1000:
                received += await connection.receive()
        yield received


async def test_first_bytes_leave_before_the_end_and_overload_is_429() -> None:
    with server("--engine", "fake", "--max-outstanding", "1", "--pool-timeout", "0.2") as base:
        async with ready(base) as http, held_open(base) as first:
            assert first.startswith(b"HTTP/1.1 200") and b"RIFF" in first  # the first segment, the rest still to come
            busy = await http.post("/v1/audio/speech", json=speech(input="hi"))
            assert busy.status_code == 429 and busy.json()["error"]["code"] == "busy"


async def test_a_client_that_disconnects_cancels_its_request() -> None:
    # One member, one request at a time, and a long wait for room: the next request can
    # only be served if the abandoned one was cancelled on the sidecar.
    with server("--engine", "fake", "--max-outstanding", "1", "--pool-timeout", str(TIMEOUT)) as base:
        async with ready(base) as http:
            async with held_open(base) as first:
                assert b"RIFF" in first
                assert (await http.get("/health")).json()["members"][0]["outstanding"] == 1
            with anyio.fail_after(TIMEOUT / 2):
                again = await http.post("/v1/audio/speech", json=speech(input="hi"))
            assert again.status_code == 200 and again.content[44:] == render_bytes("hi")
            assert 'indextts_requests_total{outcome="cancelled"} 1.0' in (await http.get("/metrics")).text


@pytest.mark.parametrize("command", [["indextts_client.http"], ["indextts_client", "serve"]])
def test_a_public_host_needs_an_api_key(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *command, "--engine", "fake", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert done.returncode == 2 and "not loopback: give --api-key, or --public" in done.stderr


def test_wav_header_streaming_sizes() -> None:
    from indextts_client.http import _wav_header

    header = _wav_header(24000, 10)
    assert len(header) == 44 and header[40:44] == (20).to_bytes(4, "little")
    streamed = _wav_header(22050, None)
    assert streamed[4:8] == b"\xff\xff\xff\xff" and np.frombuffer(streamed[24:28], "<u4")[0] == 22050


async def test_espeak_speaks_through_the_endpoint() -> None:
    pytest.importorskip("espeakng_loader")
    with server("--engine", "espeak") as base:
        async with ready(base) as http:
            body = speech(input="Hello from the endpoint.")
            wav = await http.post("/v1/audio/speech", json=body)
            assert wav.status_code == 200
            with wave.open(io.BytesIO(wav.content)) as w:
                assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (22050, 1, 2)
            native = (len(wav.content) - 44) // 2  # streamed: the header cannot know the length
            assert native > 22050 // 2  # about a second and a half of speech
            pcm = await http.post("/v1/audio/speech", json={**body, "response_format": "pcm"})
            # 24 kHz: the same duration in more samples.  (espeak-ng's output varies by a few
            # milliseconds from one call to the next, hence the 1% tolerance.)
            expected = -(-native * 24000 // 22050)
            assert abs(len(pcm.content) // 2 - expected) <= expected // 100
            faster = await http.post("/v1/audio/speech", json={**body, "speed": 2.0})
            assert faster.status_code == 200 and (len(faster.content) - 44) // 2 < native * 0.75
