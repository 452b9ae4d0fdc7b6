"""The HTTP layer's :class:`Clock` fed the progress events a request hears: the engine's
``started`` mark makes the queue wait known with the first audio (so a streamed response's
headers carry it), and the segments' spans are the last one announced."""

from __future__ import annotations

import time

import pytest

from indextts_client import ProgressEvent
from indextts_client.http import _timing
from indextts_client.http._timing import Clock


def _event(stage: str, message: str = "") -> ProgressEvent:
    return ProgressEvent(stage, None, message, 1)


def test_without_a_started_mark_a_streamed_response_has_no_queue_wait() -> None:
    clock = Clock(time.perf_counter())
    clock.progress(_event("load"))
    clock.progress(_event("prepare"))
    clock.chunk(100, 24000)
    assert set(clock.headers()) == {"X-Time-To-First-Audio"}


def test_a_started_mark_gives_the_queue_wait_before_the_sidecar_ends() -> None:
    clock = Clock(time.perf_counter() - 1.0)  # the request arrived a second ago
    clock.progress(_event("started"))
    clock.chunk(100, 24000)
    headers = clock.headers()
    assert set(headers) == {"X-Queue-Wait", "X-Time-To-First-Audio"}
    assert 1.0 <= float(headers["X-Queue-Wait"]) <= float(headers["X-Time-To-First-Audio"]) < 10.0
    # The sidecar's own timings at the end do not replace what the mark measured.
    wait = clock.queue_wait
    clock.end({"queued": 0.0, "first_audio": 0.0}, {})
    assert clock.queue_wait == wait


def test_the_last_started_mark_counts_a_retry_elsewhere_restarts_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter([10.0, 12.5])

    class Scripted:
        @staticmethod
        def perf_counter() -> float:
            return next(now)

    monkeypatch.setattr(_timing, "time", Scripted)
    clock = Clock(9.0)
    clock.progress(_event("started"))  # a member took it, then failed before any audio
    assert clock.queue_wait == 1.0
    clock.progress(_event("started"))  # the pool's retry on another member
    assert clock.queue_wait == 3.5
