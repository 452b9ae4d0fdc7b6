"""Start and stop like a server: bind first and say where, 503 ``starting`` until the sidecars
are up, exit non-zero when the engine cannot start, finish in-flight responses on SIGTERM
within the grace period and cancel them after it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from http_support import TIMEOUT, Server, server, speech  # noqa: E402

from indextts_sidecar.engines.fake import render_bytes  # noqa: E402


def _gated_python(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter that starts only once the test writes to its FIFO: the sidecars are
    held in "starting" for as long as the test likes, without a timing guess."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\ncat "{gate}" > /dev/null\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, gate


def test_it_binds_first_says_where_and_answers_starting(tmp_path: Path) -> None:
    wrapper, gate = _gated_python(tmp_path)
    with server("--engine", "fake", "--python", str(wrapper), ready=False) as s:
        line = s.wait_for("listening on")
        assert f"listening on {s.base} (engine fake, starting 1 sidecar(s))" in line
        with httpx.Client(base_url=s.base, timeout=TIMEOUT) as http:
            health = http.get("/health")
            assert health.status_code == 503 and health.json() == {"status": "starting"}
            early = http.post("/v1/audio/speech", json=speech(input="hi"))
            assert early.status_code == 503 and early.json()["error"]["code"] == "starting"
            with open(gate, "w"):
                pass  # let the sidecar start
            s.wait_for("sidecar ready: engine fake")
            s.wait_for("serving: engine fake")
            assert http.get("/health").json()["status"] == "ok"


def test_an_engine_that_cannot_start_makes_serve_exit_1_with_the_reason() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "indextts_client", "serve", "--engine", "nope", "--port", "0"],
        capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "the engine could not start: StartError" in done.stderr and "unknown engine 'nope'" in done.stderr


def _post_in_thread(s: Server, body: dict[str, Any], result: dict[str, Any], started: threading.Event) -> None:
    host, port = s.host_port
    data = json.dumps(body)
    head = f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT) as connection:
            connection.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n{data}".encode())
            received = b""
            while part := connection.recv(65536):
                received += part
                if b"\r\n\r\n" in received:
                    started.set()
            result["received"] = received
    finally:
        started.set()


def _dechunk(response: bytes) -> tuple[bytes, bool]:
    """The body of a chunked response, and whether it ended with its last chunk."""
    body = response.split(b"\r\n\r\n", 1)[1]
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out, True
        out, body = out + rest[:size], rest[size + 2 :]
    return out, False


def test_sigterm_lets_in_flight_responses_finish() -> None:
    slow = speech(input="abcdefghij", response_format="pcm", options={"chunk_seconds": 0.2, "delay": 0.3})
    result: dict[str, Any] = {}
    started = threading.Event()
    with server("--engine", "fake", "--grace", "30") as s:
        thread = threading.Thread(target=_post_in_thread, args=(s, slow, result, started))
        thread.start()
        assert started.wait(TIMEOUT)
        s.process.send_signal(signal.SIGTERM)
        thread.join(TIMEOUT)
        assert s.process.wait(TIMEOUT) == -signal.SIGTERM  # uvicorn ends by the signal, once stopped
    body, complete = _dechunk(result["received"])
    assert complete and body == render_bytes("abcdefghij")


def test_after_the_grace_period_in_flight_responses_are_cancelled() -> None:
    held = speech(input="abcdefghij", response_format="pcm", options={"chunk_seconds": 0.2, "hang_at": 1})
    result: dict[str, Any] = {}
    started = threading.Event()
    with server("--engine", "fake", "--grace", "1") as s:
        thread = threading.Thread(target=_post_in_thread, args=(s, held, result, started))
        thread.start()
        assert started.wait(TIMEOUT)
        s.process.send_signal(signal.SIGTERM)
        assert s.process.wait(TIMEOUT) == -signal.SIGTERM  # the grace is 1 s: gone well before 60
        thread.join(TIMEOUT)
    body, complete = _dechunk(result["received"])
    assert not complete and body == render_bytes("abcdefghij")[: len(body)]
