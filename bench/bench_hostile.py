"""What hostile clients can make ``indextts-client serve`` hold, with the bounds of issue 32.

    .venv/bin/python bench/bench_hostile.py [--rounds 3] [--pythonpath DIR]

Each round starts ``python -m indextts_client.http --engine fake --api-key K`` on a loopback
socket (``--pythonpath`` runs another checkout's code, to measure before a fix) and measures:

* pings: a WebSocket client without the key sends masked 125-byte pings in 1 MB writes and
  never reads (its receive buffer 4 KiB); printed: MB sent until the server reset the
  connection (capped at 128 MB) and the server's RSS growth;
* deep JSON: the median of 20 ``POST /v1/audio/speech`` whose body nests 30,000 levels,
  from the request to its answer (status printed; 0: the connection was reset);
* a stalled response: with ``--max-in-flight 1 --write-timeout 1``, a keyed client asks for
  240 s of pcm and never reads; printed: seconds until a keyed request gets its 200.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

KEY = "bench-key-123456"
AUTH = {"Authorization": f"Bearer {KEY}"}


@contextmanager
def _server(pythonpath: str, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    port = listener.getsockname()[1]
    env = {**os.environ, **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    command = [sys.executable, "-m", "indextts_client.http", "--fd", str(listener.fileno()), "--engine", "fake"]
    process = subprocess.Popen(
        [*command, "--api-key", KEY, *args], pass_fds=[listener.fileno()], env=env, stderr=subprocess.PIPE
    )
    listener.close()
    base = f"http://127.0.0.1:{port}"
    assert process.stderr is not None
    for raw in process.stderr:
        if b"serving: engine" in raw:
            break
    try:
        yield process, base
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:  # a server before the fix may not stop on SIGTERM
            process.kill()
            process.wait()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _pings(pythonpath: str) -> tuple[float, float]:
    with _server(pythonpath) as (process, base):
        before = _rss(process.pid)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", int(base.rpartition(":")[2])))
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET /v1/audio/speech/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        block = (bytes([0x89, 0x80 | 125]) + bytes(4) + b"p" * 125) * 8000
        sent = 0
        sock.settimeout(60)
        try:
            while sent < 128 * 2**20:
                sock.sendall(block)
                sent += len(block)
        except OSError:
            pass
        grown = _rss(process.pid) - before
        sock.close()
        return sent / 2**20, grown / 2**20


def _deep(pythonpath: str) -> tuple[float, int]:
    body = b'{"input": "hi", "options": {"x": ' + b"[" * 30_000 + b"]" * 30_000 + b"}}"
    with _server(pythonpath, "--max-body", str(2**20)) as (_, base), httpx.Client(base_url=base, timeout=60) as http:
        times, status = [], 0
        for _ in range(20):
            started = time.perf_counter()
            try:
                answer = http.post(
                    "/v1/audio/speech", content=body, headers={**AUTH, "Content-Type": "application/json"}
                )
                status = answer.status_code
            except httpx.HTTPError:
                status = 0  # the connection reset: no answer at all
            times.append(time.perf_counter() - started)
        return statistics.median(times), status


def _stalled(pythonpath: str) -> float:
    args = ("--max-in-flight", "1", "--write-timeout", "1")
    with _server(pythonpath, *args) as (_, base), httpx.Client(base_url=base, timeout=60) as http:
        body = json.dumps({"input": "x", "response_format": "pcm", "options": {"seconds": 240}}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", int(base.rpartition(":")[2])))
        sock.sendall(
            f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        started = time.perf_counter()
        small = {"input": "a", "response_format": "pcm"}
        while http.post("/v1/audio/speech", headers=AUTH, json=small).status_code != 200:
            if time.perf_counter() - started > 60:
                sock.close()
                return float("inf")
            time.sleep(0.05)
        sock.close()
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pythonpath", default="")
    parser.add_argument(
        "--parts", default="pings,deep,stalled", help="a checkout before the fix has no --write-timeout"
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    for round_ in range(args.rounds):
        said = []
        if "pings" in parts:
            sent, grown = _pings(args.pythonpath)
            said.append(f"pings {sent:.0f} MB sent, server +{grown:.1f} MB RSS")
        if "deep" in parts:
            deep, status = _deep(args.pythonpath)
            said.append(f"deep JSON {status} in {deep * 1000:.1f} ms")
        if "stalled" in parts:
            said.append(f"a stalled response's slot free after {_stalled(args.pythonpath):.2f} s")
        print(f"round {round_ + 1}: " + "; ".join(said), flush=True)


if __name__ == "__main__":
    main()
