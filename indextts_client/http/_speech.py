"""``POST /v1/audio/speech``: a typed request in, audio out, whole or as it is produced.

A response whose engine fails after its first byte is aborted (the connection closes
without the body's end, so the client sees an incomplete transfer); with
``stream_format=sse`` an ``error`` event says why instead.
"""

from __future__ import annotations

import base64
import enum
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Union

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Send

from .._audio import AudioChunk, TextSegment
from .._exceptions import SidecarError
from .._service import FORMATS, PCM_RATE, Backend, Prepared, Refusal, ServedStream
from ._alignment import alignment_words
from ._encoders import STREAMABLE, Encoder, check_available, make_encoder
from ._errors import HTTPError, error_for
from ._metrics import Metrics
from ._schema import SpeechRequest
from ._timing import Clock, member_of

__all__ = ["Job", "Mode", "SpeechRoute", "encode_off_loop"]

log = logging.getLogger("indextts_client.http")

Chunks = AsyncIterator[AudioChunk]


class _Aborted(Exception):
    """The body cannot be finished: end the response without its last chunk."""


class AudioStream(StreamingResponse):
    """A streamed body that a failure aborts instead of ending cleanly."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        except _Aborted:
            pass  # no final empty chunk: the server closes the connection mid-body


class Mode(enum.Enum):
    """How the response carries the audio."""

    SSE = "sse"  # OpenAI's events
    STREAM = "stream"  # the bytes as they are produced
    WHOLE = "whole"  # one body, once it is all there


class Job:
    """One speech request, prepared: what to ask the sidecar and how to answer."""

    def __init__(self, request: SpeechRequest, prepared: Prepared) -> None:
        self.request, self.prepared = request, prepared
        self.fmt = prepared.response_format
        self.rate = prepared.sample_rate
        if request.stream_format == "sse":
            self.mode = Mode.SSE
        elif self.fmt in STREAMABLE and (request.stream_format == "audio" or self.fmt != "wav"):
            self.mode = Mode.STREAM
        else:
            self.mode = Mode.WHOLE  # flac always; wav unless stream_format=audio asks for it streamed
        self.started = time.perf_counter()


async def _next(chunks: Chunks) -> Union[AudioChunk, None]:
    return await anext(chunks, None)


async def encode_off_loop(encoder: Encoder, step: Callable[[], bytes]) -> bytes:
    # PyAV's encoders take milliseconds per segment: off the event loop, so that one
    # request's encoding never holds up another's bytes.  pcm and wav are a copy.
    if encoder.blocking:
        return await anyio.to_thread.run_sync(step)
    return step()


def _sse(event: dict[str, object]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


class _Segments:
    """The ``speech.audio.segment`` events of one response: each marks one chunk as the sidecar
    sent it (an engine segment, unless one exceeds a frame), with the segment's place in the
    input where the engine gives one; the segment's text goes with its first chunk only, so
    that a segment cut into many frames does not repeat its text."""

    def __init__(self) -> None:
        self.last: Union[TextSegment, None] = None

    def event(self, seq: int, at: int, chunk: AudioChunk, arrived: Union[float, None]) -> bytes:
        samples, rate, segment = len(chunk.samples), chunk.sample_rate, chunk.segment
        event: dict[str, object] = {"type": "speech.audio.segment", "seq": seq, "first_sample": at}
        event.update(last_sample=at + samples - 1, sample_rate=rate, seconds=round(arrived or 0.0, 6))
        if segment is not None:
            if segment.span is not None:
                event.update(text_start=segment.span[0], text_end=segment.span[1])
            if self.last is None or segment.index != self.last.index:
                event["text"] = segment.text
        self.last = segment
        return _sse(event)


def _delta(data: bytes) -> bytes:
    return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})


class SpeechRoute:
    def __init__(
        self,
        backend: Backend,
        metrics: Metrics,
        prepare: Callable[[Request], Awaitable[Job]],
    ) -> None:
        self.backend, self.metrics, self.prepare = backend, metrics, prepare

    async def __call__(self, request: Request) -> Response:
        try:
            job = await self.prepare(request)
            check_available(job.fmt)
            clock = Clock(job.started)
            stream, chunks, first = await self._open(job, clock)
        except (Refusal, HTTPError) as refused:
            error = refused if isinstance(refused, HTTPError) else HTTPError(refused)
            self.metrics.requests.labels(outcome=str(error.status)).inc()
            return error.response()
        self.metrics.first_audio.observe(time.perf_counter() - job.started)
        if first is not None:
            clock.chunk(len(first.samples), first.sample_rate)
        self.metrics.timing.first(self.backend.facts.name, member_of(stream), clock)
        if job.mode is Mode.WHOLE:
            return await self._whole(job, stream, chunks, first, clock)
        body = self._produce(job, stream, chunks, first, clock)
        media_type = "text/event-stream" if job.mode is Mode.SSE else FORMATS[job.fmt]
        return AudioStream(body, media_type=media_type, headers=clock.headers())

    def _served(self, stream: ServedStream, clock: Clock) -> None:
        clock.end(stream.timings, stream.facts)
        self.metrics.timing.served(self.backend.facts.name, member_of(stream), clock)

    async def _open(self, job: Job, clock: Clock) -> tuple[ServedStream, Chunks, Union[AudioChunk, None]]:
        """The sidecar's stream, entered, and its first chunk: an error here still has a status."""
        stream = self.backend.stream(job.request.input, job.prepared, on_progress=clock.progress)  # the engine's start
        try:
            chunks = await stream.__aenter__()
            return stream, chunks, await _next(chunks)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await stream.__aexit__(None, None, None)
            if isinstance(exc, SidecarError):
                raise error_for(exc).refusal from None
            raise

    async def _whole(
        self, job: Job, stream: ServedStream, chunks: Chunks, first: Union[AudioChunk, None], clock: Clock
    ) -> Response:
        outcome = "200"
        try:
            encoder = make_encoder(job.fmt, first.sample_rate if first else job.rate or PCM_RATE, streamed=False)
            parts, chunk = [], first
            while chunk is not None:
                parts.append(await encode_off_loop(encoder, partial(encoder.feed, chunk.samples)))
                chunk = await _next(chunks)
                if chunk is not None:
                    clock.chunk(len(chunk.samples), chunk.sample_rate)
            parts.append(await encode_off_loop(encoder, encoder.finish))
        except SidecarError as exc:
            error = error_for(exc)
            outcome = str(error.status)
            return error.response()
        finally:
            with anyio.CancelScope(shield=True):
                await stream.__aexit__(None, None, None)
            self.metrics.requests.labels(outcome=outcome).inc()
            self.metrics.latency.observe(time.perf_counter() - job.started)
        self._served(stream, clock)
        return Response(b"".join(parts), media_type=FORMATS[job.fmt], headers=clock.headers())

    async def _produce(
        self, job: Job, stream: ServedStream, chunks: Chunks, first: Union[AudioChunk, None], clock: Clock
    ) -> AsyncIterator[bytes]:
        sse = job.mode is Mode.SSE
        outcome = "200"
        sent = 0
        served = left = False
        try:
            encoder = make_encoder(job.fmt, first.sample_rate if first else job.rate or PCM_RATE, streamed=True)
            chunk, seq, at, arrived = first, 0, 0, clock.first_audio
            segments = _Segments()
            while chunk is not None:
                if sse:
                    yield segments.event(seq, at, chunk, arrived)
                data = await encode_off_loop(encoder, partial(encoder.feed, chunk.samples))
                if data:
                    sent += len(data)
                    yield _delta(data) if sse else data
                seq, at = seq + 1, at + len(chunk.samples)
                chunk = await _next(chunks)
                if chunk is not None:
                    arrived = clock.chunk(len(chunk.samples), chunk.sample_rate)
            tail = await encode_off_loop(encoder, encoder.finish)
            if tail:
                yield _delta(tail) if sse else tail
            served = True
            if sse:
                # The sidecar's timings come with its end: leave the stream to have them.
                with anyio.CancelScope(shield=True):
                    left = True
                    await stream.__aexit__(None, None, None)
                self._served(stream, clock)
                words = msgspec.to_builtins(alignment_words(stream.words))
                alignment = {"type": "speech.audio.alignment", "granularity": self.backend.facts.granularity}
                yield _sse({**alignment, "words": words})
                done = {"type": "speech.audio.done", "usage": {"input_tokens": 0, "output_tokens": 0}}
                yield _sse({**done, "timings": clock.facts()})
        except SidecarError as exc:
            error = error_for(exc)
            outcome = str(error.status)
            log.warning("response aborted after %d bytes: %s: %s", sent, type(exc).__name__, exc)
            if not sse:
                raise _Aborted from None
            yield _sse({"type": "error", "error": {"message": error.message, "type": error.kind, "code": error.code}})
        except Exception as exc:  # an encoder that failed: the same honest end
            outcome = "500"
            log.error("response aborted after %d bytes", sent, exc_info=exc)
            if not sse:
                raise _Aborted from None
            yield _sse({"type": "error", "error": {"message": "encoding failed", "type": "server_error"}})
        except BaseException:
            outcome = "cancelled"  # the client went away: leaving the stream cancels on the sidecar
            raise
        finally:
            if not left:
                with anyio.CancelScope(shield=True):
                    await stream.__aexit__(None, None, None)
            self.metrics.requests.labels(outcome=outcome).inc()
            self.metrics.latency.observe(time.perf_counter() - job.started)
            if served and not sse:
                self._served(stream, clock)
