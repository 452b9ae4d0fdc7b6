"""Every OpenAI response format through the official ``openai`` package, whole and streamed,
each body decoded by PyAV and its duration checked against the sidecar's sample count."""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
av = pytest.importorskip("av")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from http_support import AUTH, KEY, RATE, TIMEOUT, Server, assert_duration, decode, server, speech  # noqa: E402

from indextts_sidecar.engines.fake import render_bytes  # noqa: E402

TEXT = "hello there, formats"
SAMPLES = len(render_bytes(TEXT)) // 2
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
CONTAINERS = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac", "wav": "wav"}


@pytest.fixture(scope="module")
def running() -> Iterator[Server]:
    with server("--engine", "fake", "--api-key", KEY) as s:
        yield s


@pytest.fixture
def client(running: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{running.base}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0) as c:
        yield c


def test_the_default_format_is_mp3(client: openai.OpenAI) -> None:
    answer = client.audio.speech.create(model="indextts", voice="alloy", input=TEXT)
    assert answer.response.headers["content-type"] == "audio/mpeg"
    container, rate, _ = decode(answer.content)
    assert (container, rate) == ("mp3", RATE)
    assert_duration("mp3", answer.content, SAMPLES, RATE)


@pytest.mark.parametrize("fmt", list(CONTENT_TYPES))
def test_every_format_whole(client: openai.OpenAI, fmt: str) -> None:
    answer = client.audio.speech.create(model="indextts", voice="alloy", input=TEXT, response_format=fmt)  # type: ignore[arg-type]
    assert answer.response.headers["content-type"] == CONTENT_TYPES[fmt]
    if fmt != "pcm":
        assert decode(answer.content)[0].split(",")[0] == CONTAINERS[fmt]
    assert_duration(fmt, answer.content, SAMPLES, RATE)


@pytest.mark.parametrize("fmt", list(CONTENT_TYPES))
def test_every_format_streamed_to_a_file(client: openai.OpenAI, fmt: str, tmp_path: Path) -> None:
    target = tmp_path / f"speech.{fmt}"
    with client.audio.speech.with_streaming_response.create(
        model="indextts",
        voice="alloy",
        input=TEXT,
        response_format=fmt,  # type: ignore[arg-type]
    ) as answer:
        assert answer.headers["content-type"] == CONTENT_TYPES[fmt]
        answer.stream_to_file(target)
    assert_duration(fmt, target.read_bytes(), SAMPLES, RATE)


def test_the_quick_start_writes_mp3_into_speech_mp3(client: openai.OpenAI, tmp_path: Path) -> None:
    target = tmp_path / "speech.mp3"
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="coral", input=TEXT) as answer:
        answer.stream_to_file(target)
    assert decode(target.read_bytes())[0] == "mp3"


def test_a_whole_wav_has_exact_sizes(client: openai.OpenAI) -> None:
    answer = client.audio.speech.create(model="indextts", voice="alloy", input=TEXT, response_format="wav")
    with wave.open(io.BytesIO(answer.content)) as w:
        assert (w.getnframes(), w.getframerate()) == (SAMPLES, RATE)
    assert int.from_bytes(answer.content[4:8], "little") == len(answer.content) - 8
    assert answer.content[44:] == render_bytes(TEXT)


def test_a_streamed_wav_says_to_the_end(running: Server) -> None:
    body = speech(input=TEXT, response_format="wav", stream_format="audio", options={"chunk_seconds": 0.2})
    with httpx.Client(base_url=running.base, headers=AUTH, timeout=TIMEOUT) as http:
        answer = http.post("/v1/audio/speech", json=body)
    assert answer.status_code == 200 and answer.headers.get("content-length") is None
    assert answer.content[4:8] == b"\xff\xff\xff\xff" and answer.content[44:] == render_bytes(TEXT)


def test_pcm_is_24_khz_and_sample_rate_resamples(running: Server) -> None:
    with httpx.Client(base_url=running.base, headers=AUTH, timeout=TIMEOUT) as http:
        pcm = http.post("/v1/audio/speech", json=speech(input=TEXT, response_format="pcm"))
        assert pcm.content == render_bytes(TEXT)
        flac = http.post("/v1/audio/speech", json=speech(input=TEXT, response_format="flac", sample_rate=16000))
    container, rate, samples = decode(flac.content)
    assert (container, rate) == ("flac", 16000) and abs(samples - SAMPLES * 2 // 3) <= 1


def test_sse_events_carry_the_format(running: Server) -> None:
    events = []
    with (
        httpx.Client(base_url=running.base, headers=AUTH, timeout=TIMEOUT) as http,
        http.stream(
            "POST", "/v1/audio/speech", json=speech(input=TEXT, response_format="opus", stream_format="sse")
        ) as answer,
    ):
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    import base64

    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert_duration("opus", audio, SAMPLES, RATE)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "pcm"])
def test_first_bytes_leave_after_the_first_segment(running: Server, fmt: str) -> None:
    # The sidecar sends its first 0.2 s segment and then holds the request until cancelled:
    # bytes of a decodable stream arrive while the rest is still to come.
    body = json.dumps(speech(input="abcdefghij", response_format=fmt, options={"chunk_seconds": 0.2, "hang_at": 1}))
    host, port = running.host_port
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    with socket.create_connection((host, port), timeout=TIMEOUT) as connection:
        connection.sendall(head)
        received = b""
        while b"\r\n\r\n" not in received or len(received) - received.index(b"\r\n\r\n") < 600:
            part = connection.recv(65536)
            assert part, received
            received += part
    assert received.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in received.lower()


def _failing(fmt: str) -> dict[str, object]:
    return speech(input="abcdefghij", response_format=fmt, options={"chunk_seconds": 0.2, "fail_at": 2})


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
@pytest.mark.parametrize("fmt", ["mp3", "pcm"])
def test_curl_sees_a_mid_stream_failure_as_an_incomplete_transfer(running: Server, fmt: str) -> None:
    done = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-H", f"Authorization: Bearer {KEY}", "-H", "Content-Type: application/json",
         "-d", json.dumps(_failing(fmt)), f"{running.base}/v1/audio/speech"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 18, done  # CURLE_PARTIAL_FILE: "transfer closed with outstanding read data"
    running.wait_for("response aborted after")


def test_httpx_sees_a_mid_stream_failure_and_sse_an_error_event(running: Server) -> None:
    with httpx.Client(base_url=running.base, headers=AUTH, timeout=TIMEOUT) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            http.post("/v1/audio/speech", json=_failing("mp3"))
        answer = http.post("/v1/audio/speech", json={**_failing("mp3"), "stream_format": "sse"})
        events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
        assert events[-1]["type"] == "error" and events[-1]["error"]["message"] == "EngineError: injected failure"
        # Before the first byte the status still says it: a whole format is an error answer.
        whole = http.post("/v1/audio/speech", json={**_failing("flac"), "options": {"fail_at": 0}})
        assert whole.status_code == 500 and whole.json()["error"]["code"] == "engine_error"


@pytest.mark.anyio
async def test_the_async_client_streams_too(running: Server, tmp_path: Path) -> None:
    async with openai.AsyncOpenAI(base_url=f"{running.base}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0) as c:
        with anyio.fail_after(TIMEOUT):
            async with c.audio.speech.with_streaming_response.create(
                model="indextts", voice="alloy", input=TEXT, response_format="aac"
            ) as answer:
                data = await answer.read()
    assert_duration("aac", data, SAMPLES, RATE)
