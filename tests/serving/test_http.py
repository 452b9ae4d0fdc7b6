"""The OpenAI-compatible endpoint: a real server process (uvicorn) and real HTTP clients (httpx).

Formats: test_http_formats.py; validation and leaks: test_http_errors.py; bounds:
test_http_bounds.py; start and stop: test_http_lifecycle.py; voices: test_http_voices.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from http_support import AUTH, KEY, TIMEOUT, server, speech  # noqa: E402

from indextts_sidecar.engines.fake import render_bytes  # noqa: E402

pytestmark = pytest.mark.anyio


async def test_pcm_at_24_khz_whatever_the_engine_rate() -> None:
    with server("--engine", "fake", "-O", "sample_rate=16000") as s:
        async with httpx.AsyncClient(base_url=s.base, timeout=TIMEOUT) as http:
            pcm = await http.post("/v1/audio/speech", json=speech(input="abcd", response_format="pcm"))
            assert pcm.status_code == 200
            native = len(render_bytes("abcd", 16000)) // 2
            assert len(pcm.content) // 2 == -(-native * 3 // 2)  # ceil(n * 24000 / 16000)
            wav = await http.post("/v1/audio/speech", json=speech(input="abcd", response_format="wav"))
            with wave.open(io.BytesIO(wav.content)) as w:
                assert (w.getframerate(), w.getnframes()) == (16000, native)


async def test_api_key_is_required_on_v1_routes() -> None:
    with server("--engine", "fake", "--api-key", KEY) as s:
        async with httpx.AsyncClient(base_url=s.base, timeout=TIMEOUT) as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                answer = await http.post("/v1/audio/speech", json=speech(input="hi"), headers=headers)
                assert answer.status_code == 401
                assert answer.json()["error"]["code"] == "invalid_api_key"
            for path in ("/v1/models", "/v1/audio/voices"):
                assert (await http.get(path)).status_code == 401
            models = await http.get("/v1/models", headers=AUTH)
            assert models.json()["data"][0]["id"] == "indextts"
            metrics = (await http.get("/metrics")).text
            assert 'indextts_requests_total{outcome="401"} 3.0' in metrics


#: Chunk 0 arrives, then the sidecar holds the request until it is cancelled.
HELD = speech(input="abcdefghij", response_format="pcm", options={"chunk_seconds": 0.2, "hang_at": 1})


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
            while b"\r\n\r\n" not in received or len(received) - received.index(b"\r\n\r\n") < 1000:
                received += await connection.receive()
        yield received


async def test_first_bytes_leave_before_the_end_and_overload_is_429() -> None:
    with server("--engine", "fake", "--max-outstanding", "1", "--pool-timeout", "0.2") as s:
        async with httpx.AsyncClient(base_url=s.base, timeout=TIMEOUT) as http, held_open(s.base) as first:
            assert first.startswith(b"HTTP/1.1 200")  # the first segment, the rest still to come
            busy = await http.post("/v1/audio/speech", json=speech(input="hi"))
            assert busy.status_code == 429 and busy.json()["error"]["code"] == "busy"


async def test_a_client_that_disconnects_cancels_its_request() -> None:
    # One member, one request at a time, and a long wait for room: the next request can
    # only be served if the abandoned one was cancelled on the sidecar.
    with server("--engine", "fake", "--max-outstanding", "1", "--pool-timeout", str(TIMEOUT)) as s:
        async with httpx.AsyncClient(base_url=s.base, timeout=TIMEOUT) as http:
            async with held_open(s.base) as first:
                assert first.startswith(b"HTTP/1.1 200")
                assert (await http.get("/health")).json()["members"][0]["outstanding"] == 1
            with anyio.fail_after(TIMEOUT / 2):
                again = await http.post("/v1/audio/speech", json=speech(input="hi", response_format="pcm"))
            assert again.status_code == 200 and again.content == render_bytes("hi")
            assert 'indextts_requests_total{outcome="cancelled"} 1.0' in (await http.get("/metrics")).text


@pytest.mark.parametrize("command", [["indextts_client.http"], ["indextts_client", "serve"]])
def test_a_public_host_needs_an_api_key(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *command, "--engine", "fake", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "INDEXTTS_API_KEY"},
    )
    assert done.returncode == 2 and "not loopback: give --api-key-file, or --public" in done.stderr


async def test_espeak_speaks_through_the_endpoint_at_its_declared_speeds() -> None:
    pytest.importorskip("espeakng_loader")
    with server("--engine", "espeak") as s:
        async with httpx.AsyncClient(base_url=s.base, timeout=TIMEOUT) as http:
            body = speech(input="Hello from the endpoint.", response_format="wav")
            wav = await http.post("/v1/audio/speech", json=body)
            assert wav.status_code == 200
            with wave.open(io.BytesIO(wav.content)) as w:
                assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (22050, 1, 2)
                native = w.getnframes()
            assert native > 22050 // 2  # about a second and a half of speech
            pcm = await http.post("/v1/audio/speech", json={**body, "response_format": "pcm"})
            # 24 kHz: the same duration in more samples.  (espeak-ng's output varies by a few
            # milliseconds from one call to the next, hence the 1% tolerance.)
            expected = -(-native * 24000 // 22050)
            assert abs(len(pcm.content) // 2 - expected) <= expected // 100
            faster = await http.post("/v1/audio/speech", json={**body, "speed": 2.0})
            assert faster.status_code == 200 and (len(faster.content) - 44) // 2 < native * 0.75
            # espeak's rate is 80..450 words a minute, 175 at speed 1: speed 3 is out of it.
            refused = await http.post("/v1/audio/speech", json={**body, "speed": 3.0})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "speed"
            assert "[0.457, 2.57]" in refused.json()["error"]["message"]


def test_serve_takes_engine_options_as_capital_o_not_say_s_output_flag() -> None:
    # Issue 23: -o is say's output file; serve's engine option is -O/--option.
    base = [sys.executable, "-m", "indextts_client", "serve", "--engine", "nope", "--port", "0"]
    refused = subprocess.run([*base, "-o", "a=1"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unrecognized arguments: -o" in refused.stderr
    bad = subprocess.run([*base, "-O", "novalue"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--option:" in bad.stderr
