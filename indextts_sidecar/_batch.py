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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Union

from . import protocol
from ._jobs import Job, JobOutput, Sink, cancelled_error, engine_failure, error_for
from .engines import BatchItem, Cancelled, Engine, EngineError, ItemDone
from .protocol import Error
from .protocol.defaults import STAGE_STARTED

__all__ = ["Take", "execute_batch"]

log = logging.getLogger("indextts_sidecar")

#: The scheduler's side of a join: given the room the engine says it has, the jobs that join
#: the running batch now (taken from their queues, already running), each with its output.
Take = Callable[[int], Sequence[tuple[Job, JobOutput]]]


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
    if native is None:
        for index, (job, _) in enumerate(jobs):
            missing = EngineError("the engine reported no sample rate after loading", code="internal")
            end(index, error_for(job.id, missing))
        return
    batch = _Batch(engine, end)

    def join(room: int) -> list[BatchItem[Any]]:
        assert take is not None
        return batch.add(take(room)) if room > 0 else []

    items = batch.add(jobs)
    chunks: Union[Iterator[Any], None] = None
    try:
        chunks = iter(engine.synthesize_batch(items) if take is None else engine.synthesize_batch(items, join))
        for index, value in chunks:
            batch.step(index, value)
            if not batch.left:
                break  # every job ended: the engine need not finish the batch
        unended = [index for index, sink in enumerate(batch.sinks) if not sink.ended]
        # Facts at the generator's end are the last request's: only a lone one's are certain.
        facts = engine.request_facts() if len(unended) == 1 else None
        for index in unended:
            batch.close(index, batch.sinks[index].done(facts))
    except Exception as exc:
        if not isinstance(exc, (Cancelled, EngineError)):
            ids = [sink.job.id for sink in batch.sinks]
            log.error("engine failed on a batch of requests %s", ids, exc_info=True)
        for index, sink in enumerate(batch.sinks):
            if not sink.ended:
                batch.close(index, engine_failure(sink.job, exc))
    finally:
        shut = getattr(chunks, "close", None)
        if shut is not None:
            shut()


class _Batch:
    """The jobs of one running batch, each with its :class:`~._jobs.Sink`, numbered as they came."""

    __slots__ = ("_end", "engine", "left", "sinks")

    def __init__(self, engine: Engine[Any, Any], end: Callable[[int, protocol.Reply], None]) -> None:
        self.engine = engine
        self._end = end
        self.sinks: list[Sink] = []
        #: Jobs not ended yet.
        self.left = 0

    def add(self, taken: Sequence[tuple[Job, JobOutput]]) -> list[BatchItem[Any]]:
        """Sinks for ``taken``, numbered on, their synthesis begun; their items, for the engine."""
        now = time.monotonic()
        items: list[BatchItem[Any]] = []
        for job, out in taken:
            job.started = now
            request = job.request
            assert request is not None
            sink = Sink(job, out)
            sink.start(self.engine.sample_rate)
            self.sinks.append(sink)
            self.left += 1
            if job.progress_wanted:
                sink.progress(STAGE_STARTED)
            items.append(BatchItem(request=request, progress=sink.progress, cancelled=job.cancel.is_set))
        return items

    def close(self, index: int, terminal: protocol.Reply) -> None:
        """End job ``index`` with ``terminal``, unless it has ended."""
        sink = self.sinks[index]
        if not sink.ended:
            sink.ended = True
            self.left -= 1
            self._end(index, terminal)

    def step(self, index: Any, value: Any) -> None:
        """One ``(index, chunk or ItemDone)`` the engine yielded."""
        sinks = self.sinks
        # A cancelled job leaves the batch at this step, whichever job the step is for.
        for other, sink in enumerate(sinks):
            if not sink.ended and sink.job.cancel.is_set():
                self.close(other, cancelled_error(sink.job))
        if not (isinstance(index, int) and 0 <= index < len(sinks)):
            raise EngineError(f"the engine yielded item index {index!r} for a batch of {len(sinks)}", code="internal")
        sink = sinks[index]
        if sink.ended:
            return  # a cancelled job's later chunks, or a chunk after its ItemDone
        if not isinstance(value, ItemDone):
            terminal = sink.chunk(value)
            if terminal is not None:
                self.close(index, terminal)
        elif value.error is None:
            # request_facts() right after an item's ItemDone(None) is about that item.
            self.close(index, sink.done(self.engine.request_facts()))
        elif isinstance(value.error, EngineError):
            self.close(index, error_for(sink.job.id, value.error))
        else:
            self.close(index, Error(code="engine_error", id=sink.job.id, message=f"ItemDone({value.error!r})"))
