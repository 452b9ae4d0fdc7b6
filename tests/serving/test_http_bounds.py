"""Every bound of the HTTP server, attacked: bodies over the limit (declared and streamed),
slow bodies, trickled and idle connections, too many requests, descriptor exhaustion."""

from __future__ import annotations

import json
import resource
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from http_support import TIMEOUT, Server, server, speech  # noqa: E402

from indextts_sidecar.engines.fake import render_bytes  # noqa: E402


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _answer(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while part := connection.recv(65536):
        received += part
    return received


def _head(s: Server, extra: str, method: str = "POST", path: str = "/v1/audio/speech") -> bytes:
    host, _ = s.host_port
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}\r\n".encode()


@pytest.fixture(scope="module")
def running() -> Iterator[Server]:
    with server(
        "--engine", "fake", "--max-input", "100", "--body-timeout", "1", "--header-timeout", "1",
        "--keep-alive-timeout", "1", "--max-in-flight", "3",
    ) as s:  # fmt: skip
        yield s


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(running: Server) -> None:
    with socket.create_connection(running.host_port, timeout=TIMEOUT) as connection:
        connection.sendall(_head(running, f"Content-Length: {100 * 2**20}\r\n"))
        answer = _answer(connection)
    assert answer.startswith(b"HTTP/1.1 413") and b'"code":"body_too_large"' in answer


def test_a_streamed_body_is_refused_while_it_is_read(running: Server) -> None:
    before = _rss(running.process.pid)
    refused_before = _count_413(running)
    chunk = b"x" * 65536
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    answer = b""
    with socket.create_connection(running.host_port, timeout=TIMEOUT) as connection:
        connection.sendall(_head(running, "Transfer-Encoding: chunked\r\n"))
        try:
            while sent < 100 * 2**20:
                connection.sendall(framed)
                sent += len(chunk)
                if select.select([connection], [], [], 0)[0]:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            answer = _answer(connection)
        except ConnectionResetError:
            pass
    # The server answers 413 and closes with the rest of the body unread, so the kernel may
    # reset the connection before the answer is read here: the metrics say what it answered.
    assert answer.startswith(b"HTTP/1.1 413") or answer == b"", answer[:200]
    assert sent < 10 * 2**20  # refused after the first 64 KiB, not after 100 MB
    assert _rss(running.process.pid) - before < 20 * 2**20
    assert _count_413(running) == refused_before + 1


def _count_413(s: Server) -> float:
    with httpx.Client(base_url=s.base, timeout=TIMEOUT) as http:
        for line in http.get("/metrics").text.splitlines():
            if line.startswith('indextts_requests_total{outcome="413"}'):
                return float(line.split()[-1])
    return 0.0


def test_a_slow_body_gets_408(running: Server) -> None:
    with socket.create_connection(running.host_port, timeout=TIMEOUT) as connection:
        connection.sendall(_head(running, "Content-Length: 100\r\n") + b'{"input": ')
        answer = _answer(connection)  # the server answers after --body-timeout (1 s); the socket waits 60
    assert answer.startswith(b"HTTP/1.1 408") and b'"code":"body_timeout"' in answer


def test_the_input_limit(running: Server) -> None:
    with httpx.Client(base_url=running.base, timeout=TIMEOUT) as http:
        ok = http.post("/v1/audio/speech", json=speech(input="a" * 100, response_format="pcm"))
        assert ok.status_code == 200 and ok.content == render_bytes("a" * 100)
        over = http.post("/v1/audio/speech", json=speech(input="a" * 101))
    assert over.status_code == 400 and over.json()["error"]["code"] == "input_too_long"


def test_a_trickled_head_is_dropped_at_the_header_deadline(running: Server) -> None:
    connections = [socket.create_connection(running.host_port, timeout=TIMEOUT) for _ in range(50)]
    try:
        for connection in connections:
            connection.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        # Meanwhile a well-behaved client is served.
        with httpx.Client(base_url=running.base, timeout=TIMEOUT) as http:
            assert http.post("/v1/audio/speech", json=speech(input="hi", response_format="pcm")).status_code == 200
        for connection in connections:
            assert _answer(connection) == b""  # closed without an answer
        assert time.monotonic() - started < 10  # the deadline is 1 s
    finally:
        for connection in connections:
            connection.close()


def test_an_idle_keep_alive_connection_is_closed(running: Server) -> None:
    with socket.create_connection(running.host_port, timeout=TIMEOUT) as connection:
        connection.sendall(_head(running, "", method="GET", path="/health"))
        started = time.monotonic()
        answer = _answer(connection)  # the answer, then the server closes the idle connection
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"}]}")
        assert time.monotonic() - started < 10  # --keep-alive-timeout 1


def test_requests_past_the_in_flight_limit_are_503_at_once() -> None:
    # Three sidecars, so that each of the three held requests has sent its first bytes.
    held = json.dumps(speech(input="abcdefghij", response_format="pcm", options={"chunk_seconds": 0.2, "hang_at": 1}))
    connections = []
    with server("--engine", "fake", "--size", "3", "--max-in-flight", "3") as running:
        _three_held_then_busy(running, held, connections)


def _three_held_then_busy(running: Server, held: str, connections: list[socket.socket]) -> None:
    try:
        for _ in range(3):
            connection = socket.create_connection(running.host_port, timeout=TIMEOUT)
            connection.sendall(_head(running, f"Content-Length: {len(held)}\r\n") + held.encode())
            assert connection.recv(65536).startswith(b"HTTP/1.1 200")
            connections.append(connection)
        with httpx.Client(base_url=running.base, timeout=TIMEOUT) as http:
            busy = http.post("/v1/audio/speech", json=speech(input="hi"))
            assert busy.status_code == 503 and busy.json()["error"]["code"] == "overloaded"
            assert busy.headers["retry-after"] == "1"
            for connection in connections:
                connection.close()
            connections.clear()
            # The held requests end when their clients leave; then there is room again.
            deadline = time.monotonic() + TIMEOUT
            while (answer := http.post("/v1/audio/speech", json=speech(input="hi"))).status_code == 503:
                assert time.monotonic() < deadline
            assert answer.status_code == 200
    finally:
        for connection in connections:
            connection.close()


def _low_descriptor_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_idle_connections_past_the_descriptor_limit_do_not_starve_requests() -> None:
    # The server may hold 256 descriptors; 300 idle connections take them all, and more wait
    # in the listen backlog.  The header deadline frees them, so real requests get through.
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 600:
        pytest.skip("the test process needs 600 descriptors")
    with server("--engine", "fake", "--header-timeout", "1", preexec_fn=_low_descriptor_limit) as s:
        idle = [socket.create_connection(s.host_port, timeout=TIMEOUT) for _ in range(300)]
        try:
            with httpx.Client(base_url=s.base, timeout=TIMEOUT) as http:
                for _ in range(5):
                    answer = http.post("/v1/audio/speech", json=speech(input="hi", response_format="pcm"))
                    assert answer.status_code == 200 and answer.content == render_bytes("hi")
        finally:
            for connection in idle:
                connection.close()
        assert s.process.poll() is None


@pytest.mark.parametrize("flag", ["--max-body", "--header-timeout", "--max-in-flight", "--grace", "--max-voices"])
def test_a_bound_must_be_positive(flag: str) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "indextts_client.http", "--engine", "fake", flag, "0"],
        capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2 and f"argument {flag}: 0 is not positive" in done.stderr
