"""Where one request's time went: response headers, SSE segment events, and the histograms of
``/metrics`` that explain latency.

Times are the HTTP server's, from the request's arrival (its body read and checked):

- **time to first audio**: until the backend handed over the first chunk;
- **queue wait**: until the engine started on the request, which is the time to first audio
  less the sidecar's own start-to-first-audio (``done.timings``: ``first_audio - queued``),
  so it holds the wait for a pool member, the transport and the sidecar's queue; or, where
  the sidecar says so with a ``started`` progress, until that arrived;
- **total**: until the last chunk; **real-time factor**: total over the audio's duration
  (below 1: faster than real time);
- **segment**: between one chunk and the next (the first one's is the time to first audio);
- the sidecar's **phases** (``done.timings``: ``queued``, ``load``, ``synthesis``);
- the engine's **stages**, where it reports them (``done.facts["stages"]``; IndexTTS: the GPT,
  s2mel and vocoder times upstream prints, parsed by the adapter; the fake engine: ``render``);
- the engine's **voice cache**: ``done.facts["voice_cache"]``, ``hit`` or ``miss``.

A streamed response's headers leave with its first audio, before the sidecar reports its
timings: they carry the time to first audio (and the queue wait once a ``started`` came);
the whole set is in the headers of a whole response, in the ``speech.audio.done`` event of
an SSE stream, and in the histograms.  A WebSocket sentence is timed the same way from its
request being sent (:meth:`Clock.of_sentence`).
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Mapping, Sequence
from typing import Union

import prometheus_client

from indextts_sidecar.protocol.defaults import STAGE_STARTED

from .._service import ServedStream
from .._stream_text import SentenceEnd
from .._types import ProgressEvent

__all__ = ["STARTED", "Clock", "LatencyMetrics"]

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_RATIO = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)
#: The progress stage that says the engine took the request off the sidecar's queue.
STARTED = STAGE_STARTED
#: The sidecar's phases that become ``indextts_sidecar_phase_seconds`` (``done.timings`` keys).
PHASES = ("queued", "load", "synthesis")
#: An engine's stage names (``done.facts["stages"]``: IndexTTS's ``gpt_gen``, ``gpt_forward``,
#: ``s2mel``, ``bigvgan``); at most :data:`MAX_STAGES` distinct ones become label values.
_STAGE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
MAX_STAGES = 16


class Clock:
    """One request's times on this server's clock, and the sidecar's once it finished."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first: Union[float, None] = None
        self.last: Union[float, None] = None
        self.ended: Union[float, None] = None
        self.samples = 0
        self.rate = 0
        self.segments: list[float] = []
        self.sidecar: dict[str, float] = {}
        self.engine_facts: dict[str, object] = {}
        #: When a ``started`` progress said the engine took the request (the last one: a pool
        #: may retry it elsewhere): the queue wait is then known with the first audio, and a
        #: streamed response's headers carry it.
        self.engine_started: Union[float, None] = None

    def progress(self, event: ProgressEvent) -> None:
        """The request's progress (its ``on_progress``): the engine's start."""
        if event.stage == STARTED:
            self.engine_started = time.perf_counter()

    @classmethod
    def of_sentence(cls, end: SentenceEnd, rate: int, arrivals: Sequence[float]) -> Clock:
        """A WebSocket sentence's times, from its request being sent: its stream measured them."""
        clock = cls(0.0)
        clock.first = end.time_to_first_audio
        clock.ended = end.total_time
        clock.samples, clock.rate = end.samples, rate
        clock.segments = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
        clock.sidecar, clock.engine_facts = dict(end.timings), dict(end.facts)
        return clock

    def chunk(self, samples: int, rate: int) -> float:
        """A chunk arrived: its arrival, in seconds since the request's."""
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            assert self.last is not None
            self.segments.append(now - self.last)
        self.last = now
        self.samples += samples
        self.rate = rate
        return now - self.started

    def end(self, sidecar: Mapping[str, float], facts: Mapping[str, object]) -> None:
        self.ended = time.perf_counter()
        self.sidecar = dict(sidecar)
        self.engine_facts = dict(facts)

    @property
    def first_audio(self) -> Union[float, None]:
        return None if self.first is None else self.first - self.started

    @property
    def total(self) -> Union[float, None]:
        return None if self.ended is None else self.ended - self.started

    @property
    def audio_seconds(self) -> float:
        return self.samples / self.rate if self.rate else 0.0

    @property
    def real_time_factor(self) -> Union[float, None]:
        total = self.total
        return None if total is None or not self.audio_seconds else total / self.audio_seconds

    @property
    def queue_wait(self) -> Union[float, None]:
        if self.engine_started is not None:
            return self.engine_started - self.started
        first, sidecar = self.first_audio, self.sidecar
        if first is None or "first_audio" not in sidecar or "queued" not in sidecar:
            return None
        return min(first, max(0.0, first - (sidecar["first_audio"] - sidecar["queued"])))

    def facts(self) -> dict[str, float]:
        """The request's timings, rounded to microseconds, those known."""
        known = {
            "queue_wait": self.queue_wait,
            "time_to_first_audio": self.first_audio,
            "total": self.total,
            "audio_seconds": self.audio_seconds if self.ended is not None else None,
            "real_time_factor": self.real_time_factor,
        }
        return {key: round(value, 6) for key, value in known.items() if value is not None}

    def headers(self) -> dict[str, str]:
        names = {
            "queue_wait": "X-Queue-Wait",
            "time_to_first_audio": "X-Time-To-First-Audio",
            "total": "X-Total-Time",
            "audio_seconds": "X-Audio-Seconds",
            "real_time_factor": "X-Real-Time-Factor",
        }
        return {names[key]: f"{value:.6f}" for key, value in self.facts().items()}


class LatencyMetrics:
    """The histograms, per engine and per pool member (``member`` is empty behind Ray)."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        labels = ["engine", "member"]

        def histogram(name: str, what: str, buckets: tuple[float, ...] = _SECONDS) -> prometheus_client.Histogram:
            return prometheus_client.Histogram(name, what, labels, buckets=buckets, registry=registry)

        self.queue_wait = histogram("indextts_queue_wait_seconds", "Arrival to the engine starting on the request")
        self.first_audio = histogram("indextts_time_to_first_audio_seconds", "Arrival to the first audio chunk")
        self.total = histogram("indextts_total_seconds", "Arrival to the last audio chunk of a served request")
        self.real_time_factor = histogram(
            "indextts_real_time_factor", "Total time over the audio's duration", buckets=_RATIO
        )
        self.segment = histogram("indextts_segment_seconds", "Time between one audio chunk and the next")
        self.phase = prometheus_client.Histogram(
            "indextts_sidecar_phase_seconds",
            "The sidecar's seconds per phase (done.timings)",
            [*labels, "phase"],
            buckets=_SECONDS,
            registry=registry,
        )
        self.stage = prometheus_client.Histogram(
            "indextts_engine_stage_seconds",
            "Seconds per engine stage of a request, as the engine reports them (done.facts stages)",
            [*labels, "stage"],
            buckets=_SECONDS,
            registry=registry,
        )
        self._stages: set[str] = set()
        self.voice_cache = prometheus_client.Counter(
            "indextts_voice_cache",
            "Requests whose voice conditioning the engine reused (hit) or computed (miss)",
            [*labels, "result"],
            registry=registry,
        )

    def first(self, engine: str, member: str, clock: Clock) -> None:
        if clock.first_audio is not None:
            self.first_audio.labels(engine, member).observe(clock.first_audio)

    def served(self, engine: str, member: str, clock: Clock) -> None:
        """A request served to its end: everything but the first audio (observed when it came)."""
        for seconds in clock.segments:
            self.segment.labels(engine, member).observe(seconds)
        for metric, value in (
            (self.queue_wait, clock.queue_wait),
            (self.total, clock.total),
            (self.real_time_factor, clock.real_time_factor),
        ):
            if value is not None:
                metric.labels(engine, member).observe(value)
        for phase in PHASES:
            if phase in clock.sidecar:
                self.phase.labels(engine, member, phase).observe(clock.sidecar[phase])
        stages = clock.engine_facts.get("stages")
        for stage, seconds in stages.items() if isinstance(stages, dict) else ():
            if self._known_stage(stage) and isinstance(seconds, (int, float)) and seconds >= 0:
                self.stage.labels(engine, member, stage).observe(seconds)
        cache = clock.engine_facts.get("voice_cache")
        if cache in ("hit", "miss"):  # nothing else: the label's values stay two
            self.voice_cache.labels(engine, member, cache).inc()

    def _known_stage(self, stage: object) -> bool:
        """A stage name fit for a label, and one of the first :data:`MAX_STAGES` seen."""
        if not isinstance(stage, str) or not _STAGE_NAME.fullmatch(stage):
            return False
        if stage not in self._stages and len(self._stages) < MAX_STAGES:
            self._stages.add(stage)
        return stage in self._stages


def member_of(stream: Union[ServedStream, SentenceEnd]) -> str:
    """The pool member's index a backend stream (or a sentence) ran on, as a label; empty when unknown."""
    index = stream.member_index
    return "" if index is None else str(index)
