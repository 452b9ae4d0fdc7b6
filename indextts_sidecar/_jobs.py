"""What a job does on the engine thread: load, unload or synthesize, and the frames it makes.

:func:`execute` runs one job against the engine and returns its terminal message; the
frames on the way (progress, audio) go to an :class:`Output`, the connection's
(:class:`~._server.Server`), which writes them or drops them once the job has ended.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, Protocol, Union

from . import protocol
from ._scheduler import Job
from .engines import Cancelled, Engine, EngineError, SynthesisRequest
from .protocol import Done, Error, Ok

__all__ = ["Output", "cancelled_error", "error_for", "execute", "shutting_down"]

log = logging.getLogger("indextts_sidecar")


class Output(Protocol):
    """Where a running job's frames go."""

    #: PCM bytes per ``audio`` frame at most (a bigger chunk is split).
    frame_bytes: int

    def progress(self, job: Job, stage: str, fraction: Union[float, None], message: str) -> None:
        """A progress frame (from the engine thread or a heartbeat thread)."""

    def audio(self, job: Job, parts: tuple[bytes, memoryview]) -> bool:
        """An audio frame; may wait for room.  False: the job was cancelled while it waited."""


def execute(engine: Engine[Any, Any], job: Job, out: Output) -> protocol.Reply:
    """Run ``job`` on ``engine``; returns its terminal message.  On the engine thread."""

    def progress(stage: str, fraction: Union[float, None] = None, message: str = "") -> None:
        if fraction is not None:
            fraction = min(1.0, max(0.0, float(fraction)))
        out.progress(job, stage, fraction, message)

    cancelled = job.cancel.is_set
    timings: dict[str, float] = {"queued": job.started - job.enqueued}
    try:
        if job.kind == "unload":
            engine.unload()
            return Ok(id=job.id, info={"loaded": engine.loaded})
        if not engine.loaded:
            began = time.monotonic()
            try:
                engine.load(progress, cancelled)
            except (Cancelled, EngineError):
                raise
            except Exception as exc:
                log.error("engine load failed: %s", exc, exc_info=True)
                raise _LoadFailed(exc) from exc
            timings["load"] = time.monotonic() - began
        if job.kind == "load":
            info = {**engine.info(), "loaded": True, "sample_rate": engine.sample_rate, **timings}
            return Ok(id=job.id, info=info)
        assert job.request is not None
        return _synthesize(engine, job, job.request, progress, timings, out)
    except Cancelled:
        return cancelled_error(job)
    except EngineError as exc:
        return error_for(job.id, exc)
    except _LoadFailed as exc:
        cause = exc.__cause__
        return Error(
            code="load_failed",
            id=job.id,
            retryable=True,
            message=f"the model failed to load: {type(cause).__name__}: {cause}",
            detail={"traceback": "".join(traceback.format_exception(cause)) if cause else ""},
        )
    except Exception as exc:
        log.error("engine failed on request %d", job.id, exc_info=True)
        return Error(
            code="engine_error",
            id=job.id,
            message=f"{type(exc).__name__}: {exc}",
            detail={"traceback": traceback.format_exc()},
        )


def _synthesize(
    engine: Engine[Any, Any],
    job: Job,
    request: SynthesisRequest[Any],
    progress: Callable[..., None],
    timings: dict[str, float],
    out: Output,
) -> protocol.Reply:
    native = engine.sample_rate
    if native is None:
        raise EngineError("the engine reported no sample rate after loading", code="internal")
    rate = request.sample_rate or native
    began = time.monotonic()
    samples = 0
    seq = 0
    chunks: Iterator[Any] = iter(engine.synthesize(request, progress, job.cancel.is_set))
    if rate != native:
        from ._resample import resampled  # numpy, only when asked for

        chunks = resampled(chunks, native, rate)
    try:
        for chunk in chunks:
            if job.cancel.is_set():
                return cancelled_error(job)
            view = memoryview(chunk).cast("B")
            if len(view) % 2:
                raise EngineError(
                    f"engine yielded a chunk of {len(view)} bytes: not whole int16 samples", code="internal"
                )
            if seq == 0 and len(view):
                timings["first_audio"] = time.monotonic() - job.enqueued
            step = out.frame_bytes
            for start in range(0, len(view), step):
                piece = view[start : start + step]
                # The samples are written from the engine's own buffer: no copy here.
                if not out.audio(job, protocol.audio_frame_parts(job.id, seq, rate, piece)):
                    return cancelled_error(job)  # while it waited for a slow parent
                seq += 1
                samples += len(piece) // 2
        if job.cancel.is_set():
            return cancelled_error(job)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    timings["synthesis"] = time.monotonic() - began
    timings["total"] = time.monotonic() - job.enqueued
    facts = engine.request_facts()
    return Done(id=job.id, samples=samples, chunks=seq, sample_rate=rate, timings=timings, facts=facts)


class _LoadFailed(Exception):
    pass


def shutting_down(job: Job) -> Error:
    return Error(code="shutting_down", id=job.id, message="the sidecar is shutting down")


def cancelled_error(job: Job) -> Error:
    if job.cancel_code == "shutting_down":
        return shutting_down(job)
    return Error(code="cancelled", id=job.id, message="cancelled while running")


def error_for(request_id: int, exc: EngineError) -> Error:
    detail: dict[str, Any] = {}
    if exc.field is not None:
        detail["field"] = exc.field
    return Error(code=exc.code, id=request_id, message=str(exc), retryable=exc.retryable, detail=detail)
