"""``POST /v1/audio/speech``: a typed request in, audio out, whole or as it is produced.

A response whose engine fails after its first byte is aborted (the connection closes
without the body's end, so the client sees an incomplete transfer); with
``stream_format=sse`` an ``error`` event says why instead.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Union

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Send

from .._exceptions import SidecarError
from ._backends import Backend
from ._encoders import STREAMABLE, Encoder, check_available, make_encoder
from ._errors import HTTPError, error_for
from ._metrics import Metrics
from ._schema import FORMATS, SpeechRequest

__all__ = ["PCM_RATE", "Job", "SpeechRoute"]

log = logging.getLogger("indextts_client.http")

#: The rate OpenAI's ``pcm`` format is defined at.
PCM_RATE = 24000


class _Aborted(Exception):
    """The body cannot be finished: end the response without its last chunk."""


class AudioStream(StreamingResponse):
    """A streamed body that a failure aborts instead of ending cleanly."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        except _Aborted:
            pass  # no final empty chunk: the server closes the connection mid-body


class Job:
    """One speech request, resolved: what to ask the sidecar and how to answer."""

    def __init__(self, request: SpeechRequest, voice: Union[str, None], options: dict[str, Any]) -> None:
        self.request = request
        self.fmt = request.response_format
        self.voice = voice
        self.options = options
        self.rate = request.sample_rate or (PCM_RATE if self.fmt == "pcm" else None)
        if request.stream_format == "sse":
            self.mode = "sse"
        elif self.fmt in STREAMABLE and (request.stream_format == "audio" or self.fmt != "wav"):
            self.mode = "stream"
        else:
            self.mode = "whole"  # flac always; wav unless stream_format=audio asks for it streamed
        self.started = time.perf_counter()


async def _next(chunks: Any) -> Any:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return None


async def _encode(encoder: Encoder, step: Callable[..., bytes], *args: Any) -> bytes:
    # PyAV's encoders take milliseconds per segment: off the event loop, so that one
    # request's encoding never holds up another's bytes.  pcm and wav are a copy.
    if encoder.blocking:
        return await anyio.to_thread.run_sync(step, *args)
    return step(*args)


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


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
            stream, chunks, first = await self._open(job)
        except HTTPError as exc:
            self.metrics.requests.labels(outcome=str(exc.status)).inc()
            return exc.response()
        self.metrics.first_audio.observe(time.perf_counter() - job.started)
        if job.mode == "whole":
            return await self._whole(job, stream, chunks, first)
        body = self._produce(job, stream, chunks, first)
        media_type = "text/event-stream" if job.mode == "sse" else FORMATS[job.fmt]
        return AudioStream(body, media_type=media_type)

    async def _open(self, job: Job) -> tuple[Any, Any, Any]:
        """The sidecar's stream, entered, and its first chunk: an error here still has a status."""
        stream = self.backend.stream(job.request.input, voice=job.voice, sample_rate=job.rate, **job.options)
        try:
            chunks = await stream.__aenter__()
            return stream, chunks, await _next(chunks)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await stream.__aexit__(None, None, None)
            if isinstance(exc, SidecarError):
                raise error_for(exc) from None
            raise

    async def _whole(self, job: Job, stream: Any, chunks: Any, first: Any) -> Response:
        outcome = "200"
        try:
            encoder = make_encoder(job.fmt, first.sample_rate if first else job.rate or PCM_RATE, streamed=False)
            parts, chunk = [], first
            while chunk is not None:
                parts.append(await _encode(encoder, encoder.feed, chunk.samples))
                chunk = await _next(chunks)
            parts.append(await _encode(encoder, encoder.finish))
        except SidecarError as exc:
            error = error_for(exc)
            outcome = str(error.status)
            return error.response()
        finally:
            with anyio.CancelScope(shield=True):
                await stream.__aexit__(None, None, None)
            self.metrics.requests.labels(outcome=outcome).inc()
            self.metrics.latency.observe(time.perf_counter() - job.started)
        return Response(b"".join(parts), media_type=FORMATS[job.fmt])

    async def _produce(self, job: Job, stream: Any, chunks: Any, first: Any) -> AsyncIterator[bytes]:
        sse = job.mode == "sse"
        outcome = "200"
        sent = 0
        try:
            encoder = make_encoder(job.fmt, first.sample_rate if first else job.rate or PCM_RATE, streamed=True)
            chunk = first
            while chunk is not None:
                data = await _encode(encoder, encoder.feed, chunk.samples)
                if data:
                    sent += len(data)
                    yield _delta(data) if sse else data
                chunk = await _next(chunks)
            tail = await _encode(encoder, encoder.finish)
            if tail:
                yield _delta(tail) if sse else tail
            if sse:
                yield _sse({"type": "speech.audio.done", "usage": {"input_tokens": 0, "output_tokens": 0}})
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
            with anyio.CancelScope(shield=True):
                await stream.__aexit__(None, None, None)
            self.metrics.requests.labels(outcome=outcome).inc()
            self.metrics.latency.observe(time.perf_counter() - job.started)
