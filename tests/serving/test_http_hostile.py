"""The speech endpoint against hostile and new clients (issue 32): deep JSON, clients that stop
reading, probes never refused for load, browsers from other origins and DNS rebinding, error
bodies without server paths, engine voices by name, uploads an engine cannot use, and the
``serve`` command's flags.  Real processes, httpx and raw sockets."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from http_support import AUTH, KEY, TIMEOUT, Server, server, speech  # noqa: E402

from indextts_sidecar.engines.fake import render_bytes  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def keyless() -> Iterator[Server]:
    with server("--engine", "fake") as s:
        yield s


def _deep(levels: int) -> bytes:
    return b'{"input": "hi", "options": {"x": ' + b"[" * levels + b"]" * levels + b"}}"


# ------------------------------------------------------------------ deep JSON


def test_deep_json_is_a_clean_400_on_post(keyless: Server) -> None:
    with httpx.Client(base_url=keyless.base, timeout=TIMEOUT) as http:
        for levels in (30_000, 65):
            answer = http.post("/v1/audio/speech", content=_deep(levels), headers={"Content-Type": "application/json"})
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "too_deep"
        # 62 levels inside the body's two: within the bound, so what the engine says of the option
        within = http.post("/v1/audio/speech", content=_deep(62), headers={"Content-Type": "application/json"})
        assert within.status_code == 400 and within.json()["error"]["code"] != "too_deep"
        assert within.json()["error"]["param"] == "options.x"
        assert http.get("/health").status_code == 200
    assert not any("Traceback" in line for line in keyless.log), "".join(keyless.log)


# ------------------------------------------------------------------ load: probes and write deadlines


def _stalled_request(s: Server, body: dict[str, Any]) -> socket.socket:
    """A keyed request whose client never reads the answer (a tiny receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(s.host_port)
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: {s.base.removeprefix('http://')}\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def _until(condition: Any, seconds: float) -> bool:
    """Whether ``condition()`` holds within ``seconds``, asked every 50 ms."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_client_that_stops_reading_loses_its_slot_and_probes_are_never_refused() -> None:
    args = ("--api-key", KEY, "--max-in-flight", "1", "--write-timeout", "1")
    with server("--engine", "fake", *args) as s, httpx.Client(base_url=s.base, timeout=TIMEOUT) as http:
        # 240 s of 24 kHz pcm: 11.5 MB, far more than the socket buffers hold.
        stalled = _stalled_request(s, speech(input="x", response_format="pcm", options={"seconds": 240}))
        try:
            # While it holds the one slot: the probes answer, a keyed request is refused for load.
            assert _until(
                lambda: http.post("/v1/audio/speech", headers=AUTH, json=speech(input="a")).status_code == 503, 30
            )
            assert http.get("/health").status_code == 200
            assert http.get("/metrics").status_code == 200
            # A request without the key is not counted against the keyed: it is told why it is refused.
            assert http.get("/v1/models").status_code == 401
            # Past the write deadline the stalled response is reset and its slot is free.
            assert _until(
                lambda: (
                    http.post(
                        "/v1/audio/speech", headers=AUTH, json=speech(input="a", response_format="pcm")
                    ).status_code
                    == 200
                ),
                30,
            )
        finally:
            stalled.close()


# ------------------------------------------------------------------ browsers


def test_a_foreign_origin_cannot_change_anything_and_an_allowed_one_gets_cors(tmp_path: Path) -> None:
    allowed = "https://app.example"
    with (
        server("--engine", "fake", "--cors-origin", allowed) as s,
        httpx.Client(base_url=s.base, timeout=TIMEOUT) as http,
    ):
        body = speech(input="hi", response_format="pcm")
        foreign = http.post("/v1/audio/speech", json=body, headers={"Origin": "https://evil.example"})
        assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "forbidden_origin"
        upload = http.post("/v1/audio/voices", headers={"Origin": "null"}, files={"audio_sample": ("a.wav", b"x")})
        assert upload.status_code == 403
        own = http.post("/v1/audio/speech", json=body, headers={"Origin": s.base})
        assert own.status_code == 200 and own.content == render_bytes("hi")
        ok = http.post("/v1/audio/speech", json=body, headers={"Origin": allowed})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == allowed
        assert "x-time-to-first-audio" in ok.headers["access-control-expose-headers"]
        preflight = {"Origin": allowed, "Access-Control-Request-Method": "POST"}
        answer = http.options(
            "/v1/audio/speech", headers={**preflight, "Access-Control-Request-Headers": "authorization"}
        )
        assert answer.status_code == 204, answer.text
        assert "authorization" in answer.headers["access-control-allow-headers"]
        assert "POST" in answer.headers["access-control-allow-methods"]
        refused = http.options("/v1/audio/speech", headers={**preflight, "Origin": "https://evil.example"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden_origin"
        # A GET from anywhere is answered, without CORS headers (the browser keeps it from the page).
        listed = http.get("/v1/models", headers={"Origin": "https://evil.example"})
        assert listed.status_code == 200 and "access-control-allow-origin" not in listed.headers


def test_a_keyless_server_answers_no_foreign_host_name(keyless: Server) -> None:
    with httpx.Client(base_url=keyless.base, timeout=TIMEOUT) as http:
        port = keyless.host_port[1]
        rebound = http.post("/v1/audio/speech", json=speech(input="hi"), headers={"Host": f"evil.example:{port}"})
        assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "forbidden_host"
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]"):
            answer = http.get("/v1/models", headers={"Host": host})
            assert answer.status_code == 200, host
    with server("--engine", "fake", "--allowed-host", "tts.lan") as s, httpx.Client(base_url=s.base) as http:
        assert http.get("/v1/models", headers={"Host": "tts.lan:80"}).status_code == 200
    with server("--engine", "fake", "--api-key", KEY) as s, httpx.Client(base_url=s.base) as http:
        assert http.get("/v1/models", headers={"Host": "tts.lan", **AUTH}).status_code == 200  # the key guards


# ------------------------------------------------------------------ voices


def _espeak() -> None:
    pytest.importorskip("espeakng_loader")


def test_engine_voices_are_spoken_by_name_and_listed_with_their_languages(tmp_path: Path) -> None:
    _espeak()
    voices = tmp_path / "voices"
    voices.mkdir()
    from voiceclips import clip

    (voices / "alice.wav").write_bytes(clip())
    args = ("--voice-dir", str(voices), "--voice", "brit=en-gb", "--voice", f"far={voices}/nowhere here.wav")
    with server("--engine", "espeak", *args) as s, httpx.Client(base_url=s.base, timeout=TIMEOUT) as http:
        for voice in ("en-gb", "zh", "fr-fr", "brit", "alloy"):
            answer = http.post("/v1/audio/speech", json=speech(input="hello", voice=voice, response_format="pcm"))
            assert answer.status_code == 200 and len(answer.content) > 1000, (voice, answer.text)
        listed = http.get("/v1/audio/voices").json()["data"]
        by_name = {(v["source"], v["name"]): v for v in listed}
        assert by_name[("mapped", "brit")]["languages"][:1] == ["en-gb"]
        english = [v for v in listed if v["source"] == "engine" and "en-gb" in v["languages"]]
        assert english and all(v["object"] == "audio.voice" for v in english)
        assert ("clip", "alice") not in by_name  # espeak cannot speak a clip: not offered
        assert ("openai", "alloy") in by_name
        # A clip, and an upload, are refused with a clear code and no path.
        for voice in ("alice", "alice.wav"):
            answer = http.post("/v1/audio/speech", json=speech(input="hello", voice=voice))
            error = answer.json()["error"]
            assert answer.status_code == 400 and error["code"] == "voice_clone_unsupported", answer.text
        upload = http.post("/v1/audio/voices", data={"name": "bob"}, files={"audio_sample": ("a.wav", clip())})
        error = upload.json()["error"]
        assert upload.status_code == 400 and (error["code"], error["param"]) == (
            "voice_clone_unsupported",
            "audio_sample",
        )
        # A mapped value the engine refuses: its error, without the path.
        far = http.post("/v1/audio/speech", json=speech(input="hello", voice="far"))
        assert far.status_code == 400 and str(tmp_path) not in far.text and "nowhere" not in far.text, far.text


# ------------------------------------------------------------------ parameters


def test_engine_option_params_are_spelled_as_the_request_spells_them(keyless: Server) -> None:
    with httpx.Client(base_url=keyless.base, timeout=TIMEOUT) as http:
        for option in ("bogus", "timeout"):
            answer = http.post("/v1/audio/speech", json=speech(input="hi", options={option: 1}))
            assert answer.status_code == 400 and answer.json()["error"]["param"] == f"options.{option}", answer.text


# ------------------------------------------------------------------ the command


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "indextts_client.http", *args],
        capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_bad_port_is_a_usage_error_not_a_traceback() -> None:
    for port in ("99999", "-1", "http"):
        done = _serve("--engine", "fake", "--port", port)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "--port" in done.stderr


def test_serve_help_explains_every_flag_and_shows_the_defaults() -> None:
    done = _serve("--help")
    assert done.returncode == 0
    text = re.sub(r"\s+", " ", done.stdout)
    for flag, default in (
        ("--host", "127.0.0.1"),
        ("--port", "8000"),
        ("--max-in-flight", "64"),
        ("--ws-max-connections", "64"),
        ("--max-voices", "256"),
        ("--write-timeout", "30.0"),
    ):
        described = re.search(re.escape(flag) + r" [A-Z_]+ ([^-].*?)\(default: ([^)]*)\)", text)
        assert described is not None and described.group(2) == default, (flag, text[:3000])
    assert "--cors-origin" in text


def test_serving_md_gives_the_streamed_wav_header_as_it_is() -> None:
    import numpy as np
    from harness import REPO

    from indextts_client.http._encoders import make_encoder

    head = make_encoder("wav", 24000, streamed=True).feed(np.zeros(4, dtype="<i2"))[:44]
    riff, data = int.from_bytes(head[4:8], "little"), int.from_bytes(head[40:44], "little")
    text = (Path(REPO) / "docs" / "serving.md").read_text(encoding="utf-8")
    assert f"RIFF size is `0x{riff:08X}` and its data size `0x{data:08X}`" in text


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_emotion_an_engine_lacks_is_refused_alike_by_the_library_the_cli_and_http(
    tmp_path: Path, anyio_backend: str
) -> None:
    _espeak()
    import anyio

    from indextts_client import Client, InvalidRequestError

    message = "engine 'espeak' has no emotion weights"
    async with Client("espeak") as client:
        with anyio.fail_after(TIMEOUT), pytest.raises(InvalidRequestError) as refused:
            await client.synthesize("hello", emotion={"happy": 0.5})
    assert (refused.value.code, refused.value.message) == ("unsupported", message)
    said = subprocess.run(
        [sys.executable, "-m", "indextts_client", "say", "hello", "--engine", "espeak", "--emotion", "happy=0.5",
         "-o", str(tmp_path / "x.wav")],
        capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert said.returncode != 0 and message in said.stderr and "Traceback" not in said.stderr, said.stderr
    assert not (tmp_path / "x.wav").exists()
    with server("--engine", "espeak") as s:
        async with httpx.AsyncClient(base_url=s.base, timeout=TIMEOUT) as http:
            answer = await http.post("/v1/audio/speech", json=speech(input="hello", emotion={"happy": 0.5}))
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["code"] == "unsupported" and error["message"].startswith(message)
