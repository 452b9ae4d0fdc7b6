"""A job and what it does on the engine thread: load, unload or synthesize, and the frames it makes.

:func:`execute` runs one job against the engine and returns its terminal message; the
frames on the way (progress, audio) go to its connection's :class:`JobOutput`, which
writes them through the connection's :class:`~._outbox.Outbox` in the connection's wire
format (:mod:`._wire`), or drops them once the job has ended.  Several ``synthesize`` jobs
run as one batch in :mod:`._batch`.  A ``synthesize`` job, alone or in a batch, writes
through its :class:`Sink`: a lone one is a loop over the engine's chunks into it.

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
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Union

from . import protocol
from ._words import WORD_BYTES, PendingWords, frames
from .engines import Cancelled, Engine, EngineError, SynthesisRequest, Words
from .protocol import Done, Error, Ok, Progress, WordSpan
from .protocol.defaults import STAGE_STARTED

if TYPE_CHECKING:
    from ._outbox import Outbox
    from ._resample import Resampler
    from ._wire import FrameParts, Wire

__all__ = [
    "CancelFlag",
    "Job",
    "JobOutput",
    "Sink",
    "cancelled_error",
    "engine_failure",
    "error_for",
    "execute",
    "shutting_down",
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
        """A progress frame of a running job (:meth:`Sink.progress` has dropped what goes nowhere)."""
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


class Sink:
    """Where one ``synthesize`` job's output goes, alone (:func:`execute`) or in a batch (:mod:`._batch`).

    What a synthesis sends is said here once: its progress (the fraction clamped to [0, 1]),
    its audio frames with their words (:mod:`._words`), cut from what the engine yields and
    converted to the asked rate by one streaming converter (:mod:`._resample`), word
    positions moved to that rate, its timings, and its one terminal message: ``done``, or the
    error a bad chunk, a cancel or a failure ends it with (:func:`engine_failure`).
    """

    __slots__ = ("began", "converter", "ended", "job", "native", "out", "pending", "rate", "samples", "seq", "timings")

    def __init__(self, job: Job, out: JobOutput) -> None:
        self.job = job
        self.out = out
        #: ``queued``, then ``load`` (a lone job that loaded the model), ``first_audio``, ``synthesis``, ``total``.
        self.timings: dict[str, float] = {"queued": job.started - job.enqueued}
        #: The rate of its frames, and the engine's, which the engine's word positions count at.
        self.rate = 0
        self.native = 0
        self.converter: Union[Resampler, None] = None
        #: When its synthesis began (:meth:`start`).
        self.began = 0.0
        #: Audio frames and samples sent so far.
        self.seq = 0
        self.samples = 0
        #: Its terminal message is given (a batch's bookkeeping).
        self.ended = False
        request = job.request
        self.pending = PendingWords(len(request.text) if request is not None else 0)

    def progress(self, stage: str, fraction: Union[float, None] = None, message: str = "") -> None:
        """The engine's progress callback for this job (:data:`~.engines.ProgressFn`)."""
        job = self.job
        # Nothing to send until a quiet spell has passed: no lock taken (the engine reports
        # progress at every step, and most requests ask for none).
        if (
            not job.progress_wanted
            and stage != "load"
            and time.monotonic() - job.last_frame < protocol.QUIET_PROGRESS_INTERVAL
        ):
            return
        if fraction is not None:
            fraction = min(1.0, max(0.0, float(fraction)))
        self.out.progress(job, stage, fraction, message)

    def start(self, native: Union[int, None]) -> None:
        """Its synthesis begins now, at the engine's ``native`` rate (known once the engine has loaded)."""
        if native is None:
            raise EngineError("the engine reported no sample rate after loading", code="internal")
        request = self.job.request
        assert request is not None
        self.native = native
        self.rate = request.sample_rate or native
        if self.rate != native:
            from ._resample import make_resampler  # numpy, only when asked for

            self.converter = make_resampler(native, self.rate)
        self.began = time.monotonic()

    def chunk(self, chunk: Any) -> Union[protocol.Reply, None]:
        """One chunk the engine yielded for this job (a step of its batch), as :meth:`feed` sends it."""
        return self.feed((chunk,))

    def feed(self, chunks: Iterable[Any]) -> Union[protocol.Reply, None]:
        """Send what the engine yields for this job (int16 audio or :class:`~.engines.Words`), in
        order; the terminal message if that ends it, else None (:meth:`done` follows)."""
        job = self.job
        cancelled = job.cancel.is_set
        pending = self.pending
        converter = self.converter
        for chunk in chunks:
            if cancelled():
                return cancelled_error(job)
            if isinstance(chunk, Words):
                if converter is not None:
                    from ._resample import rescale_words  # loaded already: the converter came from there

                    chunk = Words(rescale_words(chunk.words, self.native, self.rate))
                try:
                    pending.add(chunk)
                except EngineError as exc:
                    return error_for(job.id, exc)
                continue
            view = memoryview(chunk).cast("B")
            if len(view) % 2:
                message = f"engine yielded a chunk of {len(view)} bytes: not whole int16 samples"
                return error_for(job.id, EngineError(message, code="internal"))
            if converter is not None:
                view = memoryview(converter.feed(view))
            if not self._send(view):
                return cancelled_error(job)
        return None

    def _send(self, view: memoryview) -> bool:
        """Write ``view`` (int16 bytes at this job's rate) as audio frames; False: cancelled meanwhile."""
        job = self.job
        if self.seq == 0 and len(view):
            self.timings["first_audio"] = time.monotonic() - job.enqueued
        out = self.out
        for piece, words in frames(view, self.samples, out.frame_bytes, self.pending, out.frame_words):
            # The samples are written from the engine's own buffer: no copy here.
            if not out.audio(job, self.seq, self.rate, piece, words):
                return False
            self.seq += 1
            self.samples += len(piece) // 2
        return True

    def done(self, facts: Union[dict[str, Any], None] = None) -> protocol.Reply:
        """Its terminal message once the engine has no more audio for it, with the engine's ``facts``."""
        job = self.job
        if job.cancel.is_set():
            return cancelled_error(job)
        if self.converter is not None and not self._send(memoryview(self.converter.flush())):
            return cancelled_error(job)
        pending, room = self.pending, self.out.done_words
        if len(pending) > room:  # more words than a done frame carries fail the request
            return error_for(
                job.id,
                EngineError(
                    f"the engine reported {len(pending)} words that start past its audio's end; "
                    f"a done frame carries {room} at most",
                    code="internal",
                ),
            )
        now = time.monotonic()
        self.timings["synthesis"] = now - self.began
        self.timings["total"] = now - job.enqueued
        return Done(
            id=job.id,
            samples=self.samples,
            chunks=self.seq,
            sample_rate=self.rate,
            timings=self.timings,
            facts=facts or {},
            words=pending.rest(),
        )


def execute(engine: Engine[Any, Any], job: Job, out: JobOutput) -> protocol.Reply:
    """Run ``job`` on ``engine``; returns its terminal message.  On the engine thread."""
    sink = Sink(job, out)
    try:
        if job.kind == "synthesize" and job.progress_wanted:
            # The queue wait is over: the parent may say so before any audio.  Never a sign of
            # life for a request that asked for no progress (synthesize()'s fast path).
            sink.progress(STAGE_STARTED)
        if job.kind == "unload":
            engine.unload()
            return Ok(id=job.id, info={"loaded": engine.loaded})
        if not engine.loaded:
            began = time.monotonic()
            try:
                engine.load(sink.progress, job.cancel.is_set)
            except (Cancelled, EngineError):
                raise
            except Exception as exc:
                log.error("engine load failed: %s", exc, exc_info=True)
                return _load_failed(job, exc)
            sink.timings["load"] = time.monotonic() - began
        if job.kind == "load":
            info = {**engine.info(), "loaded": True, "sample_rate": engine.sample_rate, **sink.timings}
            return Ok(id=job.id, info=info)
        return _synthesize(engine, sink)
    except Exception as exc:
        if not isinstance(exc, (Cancelled, EngineError)):
            log.error("engine failed on request %d", job.id, exc_info=True)
        return engine_failure(job, exc)


def _synthesize(engine: Engine[Any, Any], sink: Sink) -> protocol.Reply:
    """A lone ``synthesize``: the engine's chunks, one by one, into its sink."""
    job = sink.job
    request = job.request
    assert request is not None
    sink.start(engine.sample_rate)
    chunks: Iterator[Any] = iter(engine.synthesize(request, sink.progress, job.cancel.is_set))
    try:
        terminal = sink.feed(chunks)
        return sink.done(engine.request_facts()) if terminal is None else terminal
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def engine_failure(job: Job, exc: Exception) -> Error:
    """The terminal message of ``job`` when the engine raised ``exc`` on it (alone or in its batch)."""
    if isinstance(exc, Cancelled):
        if job.cancel.is_set():
            return cancelled_error(job)
        return Error(code="engine_error", id=job.id, message="the engine stopped this request, or its batch, unasked")
    if isinstance(exc, EngineError):
        return error_for(job.id, exc)
    return Error(
        code="engine_error",
        id=job.id,
        message=f"{type(exc).__name__}: {exc}",
        detail={"traceback": "".join(traceback.format_exception(exc))},
    )


def _load_failed(job: Job, cause: Exception) -> Error:
    return Error(
        code="load_failed",
        id=job.id,
        retryable=True,
        message=f"the model failed to load: {type(cause).__name__}: {cause}",
        detail={"traceback": "".join(traceback.format_exception(cause))},
    )


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
