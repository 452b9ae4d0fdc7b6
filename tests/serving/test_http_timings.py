"""Where a request's time went, as the HTTP server reports it: response headers, SSE segment
events, the timings in ``speech.audio.done``; and the same facts on the library's Audio."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from typing import Any

import anyio
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from http_support import TIMEOUT, server, speech  # noqa: E402

from indextts_client import Client  # noqa: E402
from indextts_sidecar.engines.fake import render, render_bytes  # noqa: E402

RATE = 24000
PER_CHAR = 1440  # 0.06 s at 24 kHz


def _seconds(headers: Any, name: str) -> float:
    return float(headers[name])


def test_a_whole_response_carries_every_timing() -> None:
    with server("--engine", "fake") as s:
        answer = httpx.post(
            s.base + "/v1/audio/speech",
            json=speech(input="abcd", response_format="wav", options={"delay": 0.05, "chunk_seconds": 0.1}),
            timeout=TIMEOUT,
        )
        assert answer.status_code == 200
        headers = answer.headers
        assert _seconds(headers, "x-audio-seconds") == 4 * PER_CHAR / RATE
        first, total = _seconds(headers, "x-time-to-first-audio"), _seconds(headers, "x-total-time")
        queue = _seconds(headers, "x-queue-wait")
        # 3 chunks, each after 0.05 s of simulated compute: the first after one delay, the end after three.
        assert 0 <= queue <= first <= total and first >= 0.05 and total >= 0.15
        assert _seconds(headers, "x-real-time-factor") == pytest.approx(total / 0.24, rel=1e-4)


def test_a_streamed_response_has_its_queue_wait_and_time_to_first_audio_only() -> None:
    with server("--engine", "fake") as s:
        answer = httpx.post(s.base + "/v1/audio/speech", json=speech(input="abcd", response_format="pcm"), timeout=60)
        assert answer.status_code == 200 and answer.content == render_bytes("abcd")
        first = float(answer.headers["x-time-to-first-audio"])
        # The sidecar's "started" progress came before the first audio: the queue wait is known.
        assert 0 <= float(answer.headers["x-queue-wait"]) <= first and first > 0
        # Its headers left with the first audio, before the sidecar reported its totals.
        assert {"x-real-time-factor", "x-total-time"}.isdisjoint(answer.headers)


def test_sse_marks_each_segment_and_ends_with_the_timings() -> None:
    text = "abcdefgh"  # 8 x 1440 samples, in chunks of 0.1 s = 2400 samples
    with server("--engine", "fake") as s:
        body = speech(input=text, response_format="pcm", stream_format="sse", options={"chunk_seconds": 0.1})
        with httpx.stream("POST", s.base + "/v1/audio/speech", json=body, timeout=TIMEOUT) as answer:
            assert answer.status_code == 200
            events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: ")]
    segments = [e for e in events if e["type"] == "speech.audio.segment"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert audio == render_bytes(text)
    total = len(text) * PER_CHAR
    bounds = [(start, min(start + 2400, total) - 1) for start in range(0, total, 2400)]
    assert [(e["seq"], e["first_sample"], e["last_sample"]) for e in segments] == [
        (i, a, b) for i, (a, b) in enumerate(bounds)
    ]
    assert all(e["sample_rate"] == RATE for e in segments)
    arrivals = [e["seconds"] for e in segments]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    # Each segment's event comes before its audio.
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["speech.audio.segment", "speech.audio.delta"] and kinds[-1] == "speech.audio.done"
    timings = events[-1]["timings"]
    assert set(timings) == {"queue_wait", "time_to_first_audio", "total", "audio_seconds", "real_time_factor"}
    assert timings["audio_seconds"] == total / RATE
    assert timings["time_to_first_audio"] == arrivals[0]
    assert 0 <= timings["queue_wait"] <= timings["time_to_first_audio"] <= arrivals[-1] <= timings["total"]


def test_queue_wait_counts_the_wait_behind_another_request() -> None:
    """A request queued behind one that holds the engine waits at least as long as it is held."""
    held_for = 0.5  # the wait being measured, not a synchronisation: both ends are observed
    with server("--engine", "fake", "--size", "1") as s:
        host, port = s.host_port
        held = json.dumps(
            speech(input="abcdefghij", response_format="pcm", options={"chunk_seconds": 0.2, "hang_at": 1})
        )
        first = socket.create_connection((host, port), timeout=TIMEOUT)
        first.sendall(
            f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(held)}\r\n\r\n{held}".encode()
        )
        assert first.recv(65536).startswith(b"HTTP/1.1 200")  # it holds the engine now
        answers: list[Any] = []
        second = threading.Thread(
            target=lambda: answers.append(
                httpx.post(s.base + "/v1/audio/speech", json=speech(input="ab", response_format="wav"), timeout=60)
            )
        )
        second.start()
        deadline = time.monotonic() + TIMEOUT
        while httpx.get(s.base + "/health", timeout=TIMEOUT).json()["members"][0]["outstanding"] < 2:
            assert time.monotonic() < deadline, "the second request never reached the pool"
        queued_at = time.monotonic()
        while time.monotonic() - queued_at < held_for:
            second.join(timeout=held_for)
        assert not answers  # still waiting behind the held request
        first.close()  # the held request is cancelled: the engine turns to the second
        second.join(timeout=TIMEOUT)
        (answer,) = answers
        assert answer.status_code == 200
        queue = float(answer.headers["x-queue-wait"])
        assert held_for <= queue <= float(answer.headers["x-time-to-first-audio"])


@pytest.mark.anyio
async def test_the_library_has_the_same_facts() -> None:
    with anyio.fail_after(TIMEOUT):
        async with Client("fake") as client:
            audio = await client.synthesize("abcd", chunk_seconds=0.1)
            assert audio.queue_wait == audio.timings["queued"] and audio.queue_wait >= 0
            assert audio.time_to_first_audio == audio.timings["first_audio"]
            assert audio.real_time_factor == pytest.approx(audio.timings["total"] / (4 * PER_CHAR / RATE))
            async with client.stream("abcdefgh", chunk_seconds=0.1) as chunks:
                spans = [(chunk.offset_samples, chunk.last_sample) async for chunk in chunks]
            total = 8 * PER_CHAR
            assert spans == [(start, min(start + 2400, total) - 1) for start in range(0, total, 2400)]
            assert len(render("abcdefgh")) == total
