"""Several ``synthesize`` jobs run as one batch on the engine thread, and the jobs that join it.

:func:`execute_batch` runs them through :meth:`Engine.synthesize_batch
<indextts_sidecar.engines.Engine.synthesize_batch>`, each with its own frames, resampling
and terminal message, handed to a callback as each one ends.  For an engine that
:attr:`~indextts_sidecar.engines.Engine.joins_batches`, the scheduler hands it a ``take``:
the engine's :data:`~indextts_sidecar.engines.Join` calls it at a step boundary, and each
job it returns becomes one more entry of the running batch, numbered on from the others.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

from . import protocol
from ._jobs import Job, JobOutput, cancelled_error, error_for, words_for_done
from ._words import PendingWords, frames
from .engines import BatchItem, Cancelled, Engine, EngineError, ItemDone, Words
from .protocol import Done, Error
from .protocol.defaults import STAGE_STARTED

if TYPE_CHECKING:
    from ._resample import Resampler

__all__ = ["Take", "execute_batch"]

log = logging.getLogger("indextts_sidecar")

#: The scheduler's side of a join: given the room the engine says it has, the jobs that join
#: the running batch now (taken from their queues, already running), each with its output.
Take = Callable[[int], Sequence[tuple[Job, JobOutput]]]


class _BatchEntry:
    """One job of a batch on the engine thread: its output, rate, converter and what it sent."""

    __slots__ = (
        "began",
        "converter",
        "ended",
        "job",
        "native",
        "out",
        "pending",
        "rate",
        "samples",
        "seq",
        "timings",
    )

    def __init__(
        self, job: Job, out: JobOutput, rate: int, converter: Union[Resampler, None], now: float, native: int = 0
    ) -> None:
        self.job = job
        self.out = out
        self.rate = rate
        self.converter = converter
        #: The engine's rate, which its word positions count at (``converter`` set: not ``rate``).
        self.native = native
        self.seq = 0
        self.samples = 0
        self.timings: dict[str, float] = {"queued": now - job.enqueued}
        self.ended = False
        #: When it joined the batch (its synthesis timing starts there).
        self.began = now
        self.pending = PendingWords(len(job.request.text) if job.request is not None else 0)

    def send(self, data: Any) -> bool:
        """Write ``data`` (int16 at this job's rate) as audio frames; False: cancelled meanwhile."""
        view = memoryview(data).cast("B")
        if self.seq == 0 and len(view):
            self.timings["first_audio"] = time.monotonic() - self.job.enqueued
        out = self.out
        for piece, words in frames(view, self.samples, out.frame_bytes, self.pending, out.frame_words):
            if not out.audio(self.job, self.seq, self.rate, piece, words):
                return False
            self.seq += 1
            self.samples += len(piece) // 2
        return True

    def chunk(self, chunk: Any) -> Union[protocol.Reply, None]:
        """Send one chunk the engine yielded for this job; its terminal message if that ends it."""
        job = self.job
        if job.cancel.is_set():
            return cancelled_error(job)
        if isinstance(chunk, Words):
            if self.converter is not None:
                from ._resample import rescale_words  # loaded already: the converter came from there

                chunk = Words(rescale_words(chunk.words, self.native, self.rate))
            try:
                self.pending.add(chunk)
            except EngineError as exc:
                return error_for(job.id, exc)
            return None
        size = memoryview(chunk).nbytes
        if size % 2:
            bad = EngineError(f"engine yielded a chunk of {size} bytes: not whole int16 samples", code="internal")
            return error_for(job.id, bad)
        data = chunk if self.converter is None else self.converter.feed(chunk)
        if not self.send(data):
            return cancelled_error(job)
        return None

    def done(self, facts: Union[dict[str, Any], None] = None) -> protocol.Reply:
        """This job's terminal message once the engine has no more audio for it, with the engine's ``facts``."""
        job = self.job
        if job.cancel.is_set():
            return cancelled_error(job)
        if self.converter is not None and not self.send(self.converter.flush()):
            return cancelled_error(job)
        try:
            words = words_for_done(self.pending, self.out)
        except EngineError as exc:
            return error_for(job.id, exc)
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
            words=words,
        )


def execute_batch(
    engine: Engine[Any, Any],
    jobs: Sequence[tuple[Job, JobOutput]],
    end: Callable[[int, protocol.Reply], None],
    take: Union[Take, None] = None,
) -> None:
    """Run ``synthesize`` jobs as one batch on ``engine`` (loaded); on the engine thread.

    ``end(index, terminal)`` is called exactly once per job, as soon as it ends: a job the
    engine ends (:class:`~.engines.ItemDone`), a cancelled one at the batch's next step, the
    rest when the engine's generator returns or raises.  A bad chunk or an engine error
    for one job ends that job only; an exception escaping the generator ends every job
    not yet ended with it.  With ``take`` (an engine that joins batches), the engine's
    ``join(room)`` adds the jobs ``take(room)`` returns: indices go on from the jobs given
    so far, in the order ``take`` returned them, and they end as the others do.
    """
    native = engine.sample_rate
    entries: list[_BatchEntry] = []
    left = 0

    def close(index: int, terminal: protocol.Reply) -> None:
        nonlocal left
        entry = entries[index]
        if not entry.ended:
            entry.ended = True
            left -= 1
            end(index, terminal)

    if native is None:
        now = time.monotonic()
        for job, out in jobs:
            entries.append(_BatchEntry(job, out, 0, None, now))
        left = len(entries)
        for index, (job, _) in enumerate(jobs):
            missing = EngineError("the engine reported no sample rate after loading", code="internal")
            close(index, error_for(job.id, missing))
        return

    def add(taken: Sequence[tuple[Job, JobOutput]]) -> list[BatchItem[Any]]:
        """Entries for ``taken``, numbered on; their items, for the engine."""
        nonlocal left
        now = time.monotonic()
        items: list[BatchItem[Any]] = []
        for job, out in taken:
            job.started = now
            request = job.request
            assert request is not None
            rate = request.sample_rate or native
            converter = None
            if rate != native:
                from ._resample import make_resampler  # numpy, only when asked for

                converter = make_resampler(native, rate)
            entries.append(_BatchEntry(job, out, rate, converter, now, native))
            left += 1
            progress = _job_progress(job, out)
            if job.progress_wanted:
                progress(STAGE_STARTED)
            items.append(BatchItem(request=request, progress=progress, cancelled=job.cancel.is_set))
        return items

    def join(room: int) -> list[BatchItem[Any]]:
        assert take is not None
        return add(take(room)) if room > 0 else []

    items = add(jobs)
    chunks: Union[Iterator[Any], None] = None
    try:
        chunks = iter(engine.synthesize_batch(items) if take is None else engine.synthesize_batch(items, join))
        for index, value in chunks:
            # A cancelled job leaves the batch at this step, whichever job the step is for.
            for other, entry in enumerate(entries):
                if not entry.ended and entry.job.cancel.is_set():
                    close(other, cancelled_error(entry.job))
            if not (isinstance(index, int) and 0 <= index < len(entries)):
                raise EngineError(
                    f"the engine yielded item index {index!r} for a batch of {len(entries)}", code="internal"
                )
            entry = entries[index]
            if entry.ended:
                continue  # a cancelled job's later chunks, or a chunk after its ItemDone
            if isinstance(value, ItemDone):
                error = value.error
                if error is None:
                    # request_facts() right after an item's ItemDone(None) is about that item.
                    close(index, entry.done(engine.request_facts()))
                elif isinstance(error, EngineError):
                    close(index, error_for(entry.job.id, error))
                else:
                    close(index, Error(code="engine_error", id=entry.job.id, message=f"ItemDone({error!r})"))
            else:
                terminal = entry.chunk(value)
                if terminal is not None:
                    close(index, terminal)
            if not left:
                break  # every job ended: the engine need not finish the batch
        unended = [index for index, entry in enumerate(entries) if not entry.ended]
        # Facts at the generator's end are the last request's: only a lone one's are certain.
        facts = engine.request_facts() if len(unended) == 1 else None
        for index in unended:
            close(index, entries[index].done(facts))
    except Exception as exc:
        if not isinstance(exc, (Cancelled, EngineError)):
            ids = [entry.job.id for entry in entries]
            log.error("engine failed on a batch of requests %s", ids, exc_info=True)
        for index, entry in enumerate(entries):
            if not entry.ended:
                close(index, _batch_failure(entry.job, exc))
    finally:
        shut = getattr(chunks, "close", None)
        if shut is not None:
            shut()


def _job_progress(job: Job, out: JobOutput) -> Callable[..., None]:
    def progress(stage: str, fraction: Union[float, None] = None, message: str = "") -> None:
        if fraction is not None:
            fraction = min(1.0, max(0.0, float(fraction)))
        out.progress(job, stage, fraction, message)

    return progress


def _batch_failure(job: Job, exc: Exception) -> protocol.Reply:
    """The terminal message of a job its batch's generator failed under."""
    if isinstance(exc, Cancelled):
        if job.cancel.is_set():
            return cancelled_error(job)
        return Error(code="engine_error", id=job.id, message="the engine stopped a batch this request was in")
    if isinstance(exc, EngineError):
        return error_for(job.id, exc)
    return Error(
        code="engine_error",
        id=job.id,
        message=f"{type(exc).__name__}: {exc}",
        detail={"traceback": "".join(traceback.format_exception(exc))},
    )
