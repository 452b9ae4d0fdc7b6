"""A job and what it does on the engine thread: load, unload or synthesize, and the frames it makes.

:func:`execute` runs one job against the engine and returns its terminal message; the
frames on the way (progress, audio) go to its connection's :class:`JobOutput`, which
writes them through the connection's :class:`~._outbox.Outbox` in the connection's wire
format (:mod:`._wire`), or drops them once the job has ended.  Several ``synthesize`` jobs
run as one batch in :mod:`._batch`.

Word timings (:class:`~.engines.Words` among an engine's chunks) wait in a
:class:`~._words.PendingWords` until the audio frame that holds a word's first sample goes out,
and ride on it (``Audio.words``); those no frame reached ride on ``done``.  A request
that ends otherwise (cancelled, failed) sends no more of them.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Union

from . import protocol
from ._words import WORD_BYTES, PendingWords, frames
from .engines import Cancelled, Engine, EngineError, SynthesisRequest, Words
from .protocol import Done, Error, Ok, Progress, WordSpan
from .protocol.defaults import STAGE_STARTED

if TYPE_CHECKING:
    from ._outbox import Outbox
    from ._wire import FrameParts, Wire

__all__ = [
    "CancelFlag",
    "Job",
    "JobOutput",
    "cancelled_error",
    "error_for",
    "execute",
    "shutting_down",
    "words_for_done",
]

log = logging.getLogger("indextts_sidecar")


class CancelFlag:
    """Set by the event loop to stop a job, polled by the engine between steps.

    ``threading.Event`` without its Condition: nobody waits on it, and the poll is one attribute read.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class Job:
    """One queued or running ``synthesize``, ``load`` or ``unload``."""

    __slots__ = (
        "batched",
        "cancel",
        "cancel_code",
        "enqueued",
        "finished",
        "id",
        "kind",
        "last_frame",
        "progress_wanted",
        "request",
        "started",
    )

    def __init__(
        self,
        request_id: int,
        kind: str,
        request: Union[SynthesisRequest[Any], None] = None,
        *,
        progress_wanted: bool = True,
    ) -> None:
        self.id = request_id
        self.kind = kind
        self.request = request
        #: Set to stop the job; engines poll it between steps.
        self.cancel = CancelFlag()
        #: The error code the job ends with once ``cancel`` is set.
        self.cancel_code = "cancelled"
        self.enqueued = time.monotonic()
        self.started = 0.0
        #: Its terminal frame is sent (guarded by the scheduler's lock).
        self.finished = False
        #: False: the parent asked for no progress; only a sign of life after a quiet spell goes out.
        self.progress_wanted = progress_wanted
        #: When the last frame of the job went out (``time.monotonic``), for the sign of life.
        self.last_frame = self.enqueued
        #: It runs in a batch: a cancel answers it at once (guarded by the scheduler's lock).
        self.batched = False


#: Bytes of an ``audio`` frame besides its samples, kept free below ``--max-frame-size``: the
#: msgpack map of ``op``, ``id``, ``seq``, ``sample_rate`` and the ``pcm`` bin header takes
#: under 80; the rest is room for fields a later version adds, so that every audio frame
#: fits the limit the parent was told in ``ready``.
AUDIO_FRAME_OVERHEAD = 1024
#: PCM bytes per ``audio`` frame at most, whatever the frame limit: a parent holds a frame
#: whole before it hands any of it on, so smaller frames reach it sooner.
AUDIO_FRAME_BYTES = 4 * 1024 * 1024
#: Of :data:`AUDIO_FRAME_OVERHEAD`, what an ``audio`` frame's fields besides its words take at
#: most; the rest, and what the frame limit leaves beyond :data:`AUDIO_FRAME_BYTES`, is room
#: for words (:mod:`._words`).
AUDIO_HEAD_BYTES = 192
#: What a ``done`` frame's fields besides its words take at most (its timings and facts).
DONE_HEAD_BYTES = 8 * 1024


class JobBoard(Protocol):
    """What a job's output needs of the scheduler (:class:`~._scheduler.Scheduler`)."""

    #: Guards every queue and every ``Job.finished``.
    lock: threading.RLock

    def waiting_jobs(self, kind: str) -> Iterator[tuple[JobOutput, Job]]:
        """Every waiting job of ``kind``, on every connection, with its output.  Under the lock."""
        ...


class JobOutput:
    """Where the jobs of one connection write: its frames, in its wire format, through its outbox.

    Every terminal frame goes through :meth:`finish`, which sends it once: a job ended by
    the event loop (cancelled while queued, shutdown) and by the engine thread at the same
    time gets one.  ``live`` is the connection's map of request ids in flight: an id leaves it
    only after its terminal frame is queued, both under the lock, and the reader checks it under
    the lock, so an id is free the moment its terminal frame can be read, and never earlier.
    """

    def __init__(
        self,
        outbox: Outbox,
        wire: Wire,
        scheduler: JobBoard,
        live: MutableMapping[int, Job],
        *,
        max_frame_size: int,
        write_timeout: Union[float, None],
        on_stalled: Callable[[str], None],
    ) -> None:
        self._outbox = outbox
        self._wire = wire
        self._scheduler = scheduler
        self._lock: threading.RLock = scheduler.lock
        self.live = live
        self.write_timeout = write_timeout
        self._on_stalled = on_stalled
        #: PCM bytes per audio frame at most (whole int16 samples).
        self.frame_bytes = max(2, min(AUDIO_FRAME_BYTES, max_frame_size - AUDIO_FRAME_OVERHEAD) // 2 * 2)
        #: Words per audio frame at most, and per ``done`` frame: what fits the frame limit.
        self.frame_words = max(1, (max_frame_size - self.frame_bytes - AUDIO_HEAD_BYTES) // WORD_BYTES)
        self.done_words = max(0, (max_frame_size - DONE_HEAD_BYTES) // WORD_BYTES)

    @property
    def post(self) -> Callable[..., None]:
        """Runs a callback on this connection's event loop, from any thread."""
        return self._outbox.post

    def send(self, message: protocol.Reply) -> None:
        """Send a frame that belongs to no running job's stream; never blocks, never waits behind audio."""
        parts = self._wire.encode(message)
        if parts is not None:
            self._outbox.put(parts)

    def finish(self, job: Job, message: protocol.Reply) -> None:
        """Send ``job``'s terminal frame, unless it has one already.  From any thread."""
        with self._lock:
            if job.finished:
                return
            job.finished = True
            # The terminal frame is in the outbox before the id leaves ``live``, and the event
            # loop reads that map under this lock (Server._live): once it finds the id free, its
            # answer to a frame reusing the id (a pong, an error, a new request's audio) comes
            # after this frame on the wire; and as the frame may be written to the stream right
            # here, a parent that read it finds its id free, never still in flight.
            self.send(message)
            self.live.pop(job.id, None)

    def audio(self, job: Job, seq: int, rate: int, pcm: memoryview, words: Sequence[WordSpan] = ()) -> bool:
        """An audio frame of a running job (with ``words``, its ``Audio.words``): written at
        once when no frame waits before it; otherwise queued once one of the outbox's audio
        slots is free (a slow parent).  A job that has its terminal frame already (shutdown)
        drops it.  False: cancelled meanwhile.
        """
        parts = self._wire.audio(job.id, seq, rate, pcm, words)
        if parts is None:  # the wire keeps the samples for the terminal frame
            return True
        outbox = self._outbox
        if not job.progress_wanted:
            job.last_frame = time.monotonic()
        with self._lock:
            if job.finished or outbox.put_if_free(parts):
                return True
        return self._audio_when_free(job, parts)

    def _audio_when_free(self, job: Job, parts: FrameParts) -> bool:
        """Queue an audio frame once an audio slot is free; False if the job was cancelled first."""
        outbox = self._outbox
        since = time.monotonic()
        limit = self.write_timeout
        while not outbox.audio_slots.acquire(timeout=0.05):
            if job.cancel.is_set():
                return False
            if limit is not None and outbox.stalled_for(since) > limit:
                # Never wait on for a connection that takes nothing: the others wait on this thread.
                job.cancel.set()
                outbox.post(self._on_stalled, f"a connection took no reply bytes for {limit:g} s")
                return False
        with self._lock:
            if not job.finished:
                outbox.put(parts, audio=True)
                return True
        outbox.audio_slots.release()
        return True

    def progress(self, job: Job, stage: str, fraction: Union[float, None], message: str) -> None:
        """A progress frame of a running job; from the engine thread or a heartbeat thread."""
        with self._lock:
            if job.finished:
                return
            send = job.progress_wanted
            if not send and (now := time.monotonic()) - job.last_frame >= protocol.QUIET_PROGRESS_INTERVAL:
                job.last_frame = now  # a sign of life after a quiet spell
                send = True
            if send:
                self.send(Progress(id=job.id, stage=stage, fraction=fraction, message=message))
            if stage == "load":
                # Every request queued behind this one, on any connection, waits on the same load.
                for output, waiting in self._scheduler.waiting_jobs("synthesize"):
                    output.send(Progress(id=waiting.id, stage=stage, fraction=fraction, message=message))


def execute(engine: Engine[Any, Any], job: Job, out: JobOutput) -> protocol.Reply:
    """Run ``job`` on ``engine``; returns its terminal message.  On the engine thread."""

    def progress(stage: str, fraction: Union[float, None] = None, message: str = "") -> None:
        if fraction is not None:
            fraction = min(1.0, max(0.0, float(fraction)))
        out.progress(job, stage, fraction, message)

    cancelled = job.cancel.is_set
    timings: dict[str, float] = {"queued": job.started - job.enqueued}
    try:
        if job.kind == "synthesize" and job.progress_wanted:
            # The queue wait is over: the parent may say so before any audio.  Never a sign of
            # life for a request that asked for no progress (synthesize()'s fast path).
            progress(STAGE_STARTED)
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
    out: JobOutput,
) -> protocol.Reply:
    native = engine.sample_rate
    if native is None:
        raise EngineError("the engine reported no sample rate after loading", code="internal")
    rate = request.sample_rate or native
    began = time.monotonic()
    samples = 0
    seq = 0
    pending = PendingWords(len(request.text))
    chunks: Iterator[Any] = iter(engine.synthesize(request, progress, job.cancel.is_set))
    if rate != native:
        from ._resample import resampled  # numpy, only when asked for

        chunks = resampled(chunks, native, rate)  # Words come out at ``rate`` too
    try:
        for chunk in chunks:
            if job.cancel.is_set():
                return cancelled_error(job)
            if isinstance(chunk, Words):
                pending.add(chunk)
                continue
            view = memoryview(chunk).cast("B")
            if len(view) % 2:
                raise EngineError(
                    f"engine yielded a chunk of {len(view)} bytes: not whole int16 samples", code="internal"
                )
            if seq == 0 and len(view):
                timings["first_audio"] = time.monotonic() - job.enqueued
            for piece, words in frames(view, samples, out.frame_bytes, pending, out.frame_words):
                # The samples are written from the engine's own buffer: no copy here.
                if not out.audio(job, seq, rate, piece, words):
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
    words = words_for_done(pending, out)
    return Done(id=job.id, samples=samples, chunks=seq, sample_rate=rate, timings=timings, facts=facts, words=words)


def words_for_done(pending: PendingWords, out: JobOutput) -> list[WordSpan]:
    """The words no audio frame carried, for ``done``; more than it can carry fail the request."""
    if len(pending) > out.done_words:
        raise EngineError(
            f"the engine reported {len(pending)} words that start past its audio's end; "
            f"a done frame carries {out.done_words} at most",
            code="internal",
        )
    return pending.rest()


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
