"""Validation, error answers and what they reveal: every 4xx and 5xx is OpenAI's error JSON,
no malformed body gives a 500, nothing internal reaches an API client, and the API key
comes from a file or the environment and never reaches a sidecar."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from http_support import AUTH, KEY, TIMEOUT, Server, environ, server, speech  # noqa: E402

from indextts_sidecar.engines.fake import render_bytes  # noqa: E402


@pytest.fixture(scope="module")
def running() -> Iterator[Server]:
    with server("--engine", "fake", "--api-key", KEY) as s:
        yield s


@pytest.fixture
def http(running: Server) -> Iterator[Any]:
    with httpx.Client(base_url=running.base, headers=AUTH, timeout=TIMEOUT) as client:
        yield client


def _is_openai_error(answer: Any, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return dict(error)


def test_404_and_405_are_error_json(http: Any) -> None:
    assert _is_openai_error(http.get("/v1/nope"), 404)["code"] == "not_found"
    assert _is_openai_error(http.get("/v1/audio/speech"), 405)["code"] == "method_not_allowed"


MALFORMED = [
    (b'{"input": "hi", "response_format": ["mp3"]}', "response_format"),
    (b'{"input": "hi", "response_format": {"a": 1}}', "response_format"),
    (b'{"input": "hi", "response_format": "ogg"}', "response_format"),
    (b'{"input": "hi", "speed": ' + b"9" * 400 + b"}", "speed"),
    (b'{"input": "hi", "speed": "fast"}', "speed"),
    (b'{"input": "hi", "speed": 0.1}', "speed"),
    (b'{"input": "hi", "voice": 7}', "voice"),
    (b'{"input": "hi", "options": []}', "options"),
    (b'{"input": "hi", "sample_rate": 3}', "sample_rate"),
    (b'{"input": 12}', "input"),
    (b'{"input": "   "}', "input"),
    (b'{"voice": "alloy"}', "input"),
    (b'{"input": "hi", "instructions": "  "}', "instructions"),
    (b'{"input": "hi", "options": {"nope": 1}}', "options.nope"),
    (b'{"input": "hi", "options": {"fail_at": "x"}}', "options.fail_at"),
    (b"[1, 2]", None),
    (b'"text"', None),
    (b"{", None),
    (b"\xff\xfe", None),
    (b"", None),
]


@pytest.mark.parametrize(("body", "param"), MALFORMED)
def test_a_malformed_body_is_a_400_naming_its_field(http: Any, body: bytes, param: Any) -> None:
    answer = http.post("/v1/audio/speech", content=body, headers={"Content-Type": "application/json"})
    assert _is_openai_error(answer, 400)["param"] == param


def test_a_body_must_be_json(http: Any) -> None:
    body = json.dumps(speech(input="hi"))
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        answer = http.post("/v1/audio/speech", content=body, headers=headers)
        assert _is_openai_error(answer, 415)["code"] == "bad_content_type"
    ok = http.post(
        "/v1/audio/speech", content=body, headers={"Content-Type": "application/json; charset=utf-8"}
    )  # fmt: skip
    assert ok.status_code == 200


def test_speed_goes_through_the_engines_declaration(http: Any) -> None:
    # The fake engine declares seconds_per_char 0.06 at speed 1, inversely, within 0.015..0.24.
    normal = http.post("/v1/audio/speech", json=speech(input="abcd", response_format="pcm"))
    fast = http.post("/v1/audio/speech", json=speech(input="abcd", response_format="pcm", speed=2.0))
    assert normal.content == render_bytes("abcd") and len(fast.content) == len(normal.content) // 2
    both = http.post("/v1/audio/speech", json=speech(input="x", speed=2.0, options={"seconds_per_char": 0.1}))
    assert _is_openai_error(both, 400)["param"] == "speed"


def test_voices_never_reach_the_engine_as_paths(http: Any, tmp_path: Path) -> None:
    secret = tmp_path / "secret.wav"
    secret.write_bytes(b"RIFF")
    folder = tmp_path / "folder"
    folder.mkdir()
    unreadable = tmp_path / "unreadable.wav"
    unreadable.write_bytes(b"RIFF")
    unreadable.chmod(0)
    answers = set()
    for voice in ("/etc/passwd", str(secret), str(folder), str(unreadable), "/no/such/file", "../etc/passwd"):
        error = _is_openai_error(http.post("/v1/audio/speech", json=speech(input="hi", voice=voice)), 400)
        assert error["param"] == "voice" and error["code"] == "unknown_voice"
        answers.add(error["message"].replace(repr(voice[:64]), "VOICE"))
    assert len(answers) == 1  # the same text whether the path exists, is a folder or unreadable


def test_errors_carry_no_traceback_stderr_or_path(running: Server, http: Any) -> None:
    # An engine bug (a raw RuntimeError, with a traceback in the sidecar's detail) and a
    # crash with stderr written just before it.
    raw = http.post(
        "/v1/audio/speech", json=speech(input="hi", response_format="flac", options={"fail_at": 0, "fail_raw": True})
    )
    crash = http.post(
        "/v1/audio/speech",
        json=speech(input="hi", response_format="flac", options={"crash_at": 0, "stderr_bytes": 2000}),
    )
    for answer in (raw, crash):
        error = _is_openai_error(answer, answer.status_code)
        assert answer.status_code in (500, 503)
        text = answer.text
        for leak in ("Traceback", "stderr", 'File "', "/", "x" * 20):
            assert leak not in text, (leak, text)
        assert error["message"].split()[0]  # a class and a short message
    running.wait_for("request failed: CrashedError")  # the whole story is in the server's log


def test_health_without_the_key_says_only_its_status(running: Server) -> None:
    with httpx.Client(base_url=running.base, timeout=TIMEOUT) as anonymous:
        assert anonymous.get("/health").json() == {"status": "ok"}
        detailed = anonymous.get("/health", headers=AUTH).json()
    assert detailed["status"] == "ok" and detailed["members"][0]["state"] == "ready"


def _sidecar_environment(base: str, headers: dict[str, str]) -> bytes:
    with httpx.Client(base_url=base, headers=headers, timeout=TIMEOUT) as http:
        pid = http.get("/health").json()["members"][0]["pid"]
    return Path(f"/proc/{pid}/environ").read_bytes()


def test_the_key_from_a_file_or_the_environment_never_reaches_a_sidecar(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    for args, env in (
        (["--api-key-file", str(key_file)], environ()),
        ([], environ(INDEXTTS_API_KEY=KEY)),
    ):
        with server("--engine", "fake", *args, env=env) as s:
            with httpx.Client(base_url=s.base, timeout=TIMEOUT) as http:
                assert http.get("/v1/models").status_code == 401
                assert http.get("/v1/models", headers=AUTH).status_code == 200
            environment = _sidecar_environment(s.base, AUTH)
            assert KEY.encode() not in environment and b"INDEXTTS_API_KEY" not in environment
            assert KEY not in " ".join(Path(f"/proc/{s.process.pid}/cmdline").read_text().split("\0"))


def test_an_empty_or_missing_key_file_is_a_usage_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "empty").write_text("\n")
    for path, message in ((tmp_path / "empty", "the file is empty"), (tmp_path / "missing", "cannot read it")):
        done = subprocess.run(
            [sys.executable, "-m", "indextts_client.http", "--engine", "fake", "--api-key-file", str(path)],
            capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ},
        )  # fmt: skip
        assert done.returncode == 2 and message in done.stderr
