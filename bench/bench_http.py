"""What the HTTP server adds to a request, and what each encoder costs.

    .venv/bin/python bench/bench_http.py [--rounds 5] [--requests 200] [--seconds 30]

Part 1, interleaved against the direct ``Client``: a fake sidecar behind
``python -m indextts_client.http`` (its own process, one sidecar) and a fake sidecar of a
``Client`` in this process.  Each round runs ``--requests`` requests on each path, in an
order that alternates from round to round, and takes the medians of

* the whole request: ``pcm`` of "hello there" (0.66 s of audio, one chunk) over a kept-alive
  httpx connection, against ``client.synthesize`` of the same text;
* the time to the first byte: a 10-chunk ``pcm`` stream's first body bytes, against
  ``client.stream``'s first chunk.

It prints, per round, each median and the HTTP path's extra milliseconds, and over the rounds
the median extra with its min-max.

Part 2: each encoder's CPU per second of audio (``time.process_time`` around encoding
``--seconds`` of 24 kHz audio fed in 0.5 s segments, as the server feeds them), formats in a
rotating order per round; printed as "x real time" on one core (median, min-max).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import anyio
import httpx

from indextts_client import Client
from indextts_client.http._encoders import make_encoder
from indextts_sidecar.engines.fake import render

TEXT = "hello there"
STREAM = {"chunk_seconds": 0.06, "seconds": 0.6}  # 10 chunks


def _start_server() -> tuple[subprocess.Popen[bytes], str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    command = [sys.executable, "-m", "indextts_client.http", "--engine", "fake", "--fd", str(listener.fileno())]
    process = subprocess.Popen(command, pass_fds=[listener.fileno()], stderr=subprocess.PIPE)
    listener.close()
    assert process.stderr is not None
    for line in process.stderr:
        if b"serving: engine" in line:
            break
    else:
        raise SystemExit("the server did not start")
    return process, f"http://127.0.0.1:{port}"


async def _http_request(http: httpx.AsyncClient) -> float:
    started = time.perf_counter()
    answer = await http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"})
    assert answer.status_code == 200 and answer.content
    return time.perf_counter() - started


async def _direct_request(client: Client) -> float:
    started = time.perf_counter()
    audio = await client.synthesize(TEXT)
    assert len(audio)
    return time.perf_counter() - started


async def _http_first_byte(http: httpx.AsyncClient) -> float:
    started = time.perf_counter()
    body = {"input": TEXT, "response_format": "pcm", "options": STREAM}
    first = None
    async with http.stream("POST", "/v1/audio/speech", json=body) as answer:
        async for _ in answer.aiter_raw():
            if first is None:
                first = time.perf_counter() - started
    assert first is not None
    return first


async def _direct_first_chunk(client: Client) -> float:
    started = time.perf_counter()
    first = None
    async with client.stream(TEXT, **STREAM) as chunks:
        async for _ in chunks:
            if first is None:
                first = time.perf_counter() - started
    assert first is not None
    return first


async def _median(measure: Any, target: Any, count: int) -> float:
    return statistics.median([await measure(target) for _ in range(count)])


async def part1(rounds: int, requests: int) -> None:
    process, base = _start_server()
    try:
        async with Client("fake") as client, httpx.AsyncClient(base_url=base, timeout=60) as http:
            for warm in (_http_request(http), _direct_request(client)):
                await warm
            extra: dict[str, list[float]] = {"request": [], "first byte": []}
            for index in range(rounds):
                for name, on_http, direct in (
                    ("request", _http_request, _direct_request),
                    ("first byte", _http_first_byte, _direct_first_chunk),
                ):
                    pair = [(on_http, http), (direct, client)]
                    order = pair if index % 2 == 0 else pair[::-1]
                    medians = {id(m): await _median(m, t, requests) for m, t in order}
                    h, d = medians[id(on_http)] * 1e3, medians[id(direct)] * 1e3
                    extra[name].append(h - d)
                    print(f"round {index + 1} {name:>10}: http {h:.3f} ms, direct {d:.3f} ms, extra {h - d:.3f} ms")
            for name, values in extra.items():
                low, high = min(values), max(values)
                print(f"{name}: extra {statistics.median(values):.3f} ms median (min {low:.3f}, max {high:.3f})")
    finally:
        process.terminate()
        process.wait(30)


def part2(rounds: int, seconds: float) -> None:
    audio = render("x" * round(seconds / 0.06), 24000)
    step = 12000
    formats = ["mp3", "opus", "aac", "flac", "wav"]
    speeds: dict[str, list[float]] = {f: [] for f in formats}
    for index in range(rounds):
        for fmt in formats[index % len(formats) :] + formats[: index % len(formats)]:
            started = time.process_time()
            encoder = make_encoder(fmt, 24000, streamed=fmt != "flac")
            size = 0
            for start in range(0, len(audio), step):
                size += len(encoder.feed(audio[start : start + step]))
            size += len(encoder.finish())
            cpu = time.process_time() - started
            speeds[fmt].append(len(audio) / 24000 / cpu)
    for fmt, values in speeds.items():
        low, high = min(values), max(values)
        print(f"encode {fmt:>4}: {statistics.median(values):7.0f}x real time (min {low:.0f}, max {high:.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "1")
    anyio.run(part1, args.rounds, args.requests)
    part2(args.rounds, args.seconds)


if __name__ == "__main__":
    main()
