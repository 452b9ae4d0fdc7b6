"""The engine thread and the queues that feed it.

Engines wrap libraries that are not thread-safe and that keep per-thread state (CUDA
streams, caches), so one long-lived thread makes every engine call, one at a time.  It
takes its next job itself, round robin over the :class:`Lane` of each connection attached
(over stdio one; over a socket one per connection), so no connection starves another
and no event loop turn is spent between two jobs.

The scheduler owns every lane: a connection queues, cancels and stops its jobs through
:meth:`Scheduler.enqueue`, :meth:`~Scheduler.cancel` and :meth:`~Scheduler.stop_all`, and
reads its depth and running job from its lane.  One lock, :attr:`Scheduler.lock`, guards
every lane and every job's ``finished`` flag: the event loop (enqueue, cancel, stop) and
the engine thread (pick, finish) decide under it.  What they write under it goes through
the connection's :class:`~._outbox.Outbox`, which never blocks; waiting for room (an
audio slot) happens outside it.

An engine whose :attr:`~.engines.Engine.max_batch` is 2 or more gets several
``synthesize`` jobs at once when several wait once its model is loaded: the engine thread
takes the first as usual and then, going on round robin, the next ``synthesize`` at the
head of each lane, up to ``max_batch``, and runs them through
:func:`~._batch.execute_batch`.  A lone job starts at once, unless ``batch_wait`` asks the
thread to wait that long for company: "at once" is after the event loop has gone round
(microseconds), so that the other requests of a burst, read together with it but not yet
queued, join it instead of forming a second batch; a batch that is not full waits for the
loop the same way (without ``batch_wait``).  A job of a batch that is cancelled is
answered at once; the engine drops it at its next step.

An engine that :attr:`~.engines.Engine.joins_batches` gets every ``synthesize`` that way, a
lone one as a batch of one, and the batch takes more while it runs: at each step boundary
the engine's ``join`` takes the ``synthesize`` jobs at the lanes' heads, round robin, up to
``max_batch`` live (:meth:`Scheduler._joiners`).  It takes none while a job of another kind
waits at a lane's head, so that the batch drains and that job runs, nor once closed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any, Union

import anyio

from ._batch import execute_batch
from ._jobs import Job, JobOutput, cancelled_error, execute, shutting_down
from .engines import Engine
from .protocol import Error

__all__ = ["Job", "Lane", "Scheduler"]

log = logging.getLogger("indextts_sidecar")

#: Seconds the engine thread waits at most for the event loop to go round before a lone job
#: starts (see :meth:`Scheduler._loop_barrier`); a loop that busy is a bug elsewhere.
BARRIER_TIMEOUT = 0.25


class Lane:
    """One connection's jobs at the scheduler: those waiting, in order, and those running."""

    __slots__ = ("active", "idle_waiter", "output", "waiting")

    def __init__(self, output: JobOutput) -> None:
        self.output = output
        #: Waiting for the engine thread, oldest first.
        self.waiting: dict[int, Job] = {}
        #: Taken by the engine thread and not yet ended there: one, or several of a batch.
        self.active: list[Job] = []
        #: Set (on the event loop) when the running jobs end, if the event loop waits for that.
        self.idle_waiter: Union[anyio.Event, None] = None

    @property
    def running(self) -> Union[Job, None]:
        """The oldest job running that has no terminal frame yet, if any."""
        for job in self.active:
            if not job.finished:
                return job
        return None

    @property
    def depth(self) -> int:
        """Jobs waiting, not counting the running one (read without the lock: a health figure)."""
        return len(self.waiting)


class Scheduler:
    """One engine thread, fed round robin from the lanes of the connections attached to it."""

    def __init__(self, engine: Engine[Any, Any], *, batch_wait: float = 0.0) -> None:
        self.engine = engine
        #: Jobs per batch at most (read once: it must not change while serving).
        self.max_batch = max(1, int(engine.max_batch))
        #: Every ``synthesize`` runs as a batch, which the jobs that come meanwhile join (read once).
        self.joins = self.max_batch > 1 and bool(engine.joins_batches)
        #: Seconds a lone ``synthesize`` waits for company when the engine batches.
        self.batch_wait = batch_wait
        self.started = time.monotonic()
        #: Guards every lane and every ``Job.finished``.
        self.lock = threading.RLock()
        self._lanes: list[Lane] = []
        self._turn = 0
        self._closed = False
        # One token per job queued (or on close): the engine thread sleeps in a C-level
        # queue, one futex away, instead of a Python Condition.
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="indextts-engine", daemon=True)

    # ------------------------------------------------------- connections

    def attach(self, output: JobOutput) -> Lane:
        """A lane for a new connection, whose jobs write to ``output``; starts the engine thread."""
        lane = Lane(output)
        with self.lock:
            self._lanes.append(lane)
            if not self._thread.is_alive() and not self._closed:
                self._thread.start()
        return lane

    def detach(self, lane: Lane) -> None:
        with self.lock:
            if lane in self._lanes:
                self._lanes.remove(lane)

    def close(self) -> None:
        """Let the engine thread end after its current job."""
        with self.lock:
            self._closed = True
        self._tokens.put(None)

    # -------------------------------------------------------------- jobs

    def enqueue(self, lane: Lane, job: Job, limit: int) -> Union[int, None]:
        """Queue ``job`` behind ``lane``'s others; None when queued, else the depth that refused it."""
        with self.lock:
            if len(lane.waiting) >= limit:
                return len(lane.waiting)
            lane.waiting[job.id] = job
        self._tokens.put(None)
        return None

    def cancel(self, lane: Lane, job_id: int, reason: Union[Error, None] = None) -> bool:
        """Stop job ``job_id`` of ``lane``; False if it is neither waiting nor running.

        A waiting job leaves the queue and ends at once, with ``reason`` (default: cancelled
        while queued); a running one is told to stop and ends on the engine thread, in order,
        except one of a batch, which is answered at once (the engine drops it at its next step).
        """
        with self.lock:
            job = lane.waiting.pop(job_id, None)
            if job is not None:
                if reason is None:
                    reason = Error(code="cancelled", id=job_id, message="cancelled while queued")
                lane.output.finish(job, reason)
                return True
            for running in lane.active:
                if running.id == job_id and not running.finished:
                    running.cancel.set()
                    if running.batched:
                        lane.output.finish(running, cancelled_error(running))
                    self._tokens.put(None)  # a lone job waiting for company stops waiting
                    return True
        return False

    def stop_all(self, lane: Lane, code: str = "shutting_down") -> Union[anyio.Event, None]:
        """End ``lane``'s waiting jobs (``shutting_down``) and tell its running ones to stop.

        Returns an event set once the running jobs have ended, or None when none runs.  Loop thread.
        """
        with self.lock:
            for job in list(lane.waiting.values()):
                del lane.waiting[job.id]
                lane.output.finish(job, shutting_down(job))
            if not lane.active:
                return None
            for running in lane.active:
                running.cancel_code = code
                running.cancel.set()
            self._tokens.put(None)  # a lone job waiting for company stops waiting
            return self._idle_event(lane)

    def until_idle(self, lane: Lane) -> Union[anyio.Event, None]:
        """None if ``lane`` has nothing waiting or running; else an event set when its running job ends
        (wait, then ask again).  Loop thread."""
        with self.lock:
            if not lane.waiting and not lane.active:
                return None
            return self._idle_event(lane)

    def _idle_event(self, lane: Lane) -> anyio.Event:
        idle = lane.idle_waiter = anyio.Event()
        return idle

    def waiting_jobs(self, kind: str) -> Iterator[tuple[JobOutput, Job]]:
        """Every waiting job of ``kind``, on every connection, with its output.  Under the lock."""
        for lane in self._lanes:
            for job in lane.waiting.values():
                if job.kind == kind:
                    yield lane.output, job

    # ------------------------------------------------------ engine thread

    def _pick(self) -> Union[tuple[Lane, Job], None]:
        """The next job, round robin over the lanes; it becomes its lane's running job.  Under the lock."""
        count = len(self._lanes)
        for step in range(count):
            index = (self._turn + step) % count
            lane = self._lanes[index]
            if lane.waiting:
                # The next turn starts after this connection: round robin.
                self._turn = index + 1
                job = lane.waiting.pop(next(iter(lane.waiting)))
                lane.active.append(job)
                return lane, job
        return None

    def _companions(self, batch: list[tuple[Lane, Job]], limit: Union[int, None] = None) -> None:
        """Add ``synthesize`` jobs to ``batch`` up to ``limit`` (``max_batch``), round robin.  Under the lock.

        Only a job at the head of its lane joins: a connection's jobs start in its order.
        """
        while len(batch) < (self.max_batch if limit is None else limit):
            count = len(self._lanes)
            for step in range(count):
                index = (self._turn + step) % count
                lane = self._lanes[index]
                if lane.waiting:
                    head = lane.waiting[next(iter(lane.waiting))]
                    if head.kind == "synthesize":
                        self._turn = index + 1
                        del lane.waiting[head.id]
                        lane.active.append(head)
                        batch.append((lane, head))
                        break
            else:
                return

    def _take(self) -> Union[list[tuple[Lane, Job]], None]:
        """What the engine thread runs next: one job, or a batch of ``synthesize`` jobs."""
        with self.lock:
            if self._closed:
                return None
            picked = self._pick()
            if picked is None:
                return []
            batch = [picked]
            if not self._batches(picked[1]):
                return batch
            self._companions(batch)
            if len(batch) >= self.max_batch:
                return self._as_batch(batch)
            lane = picked[0]
        if len(batch) > 1 or self.batch_wait <= 0:
            # The rest of a burst may be decoded on the event loop right now (frames read
            # together, or already waiting in the connection): let the loop go round first,
            # whether one or several of the burst were queued when the thread took them.
            self._loop_barrier(lane)
            with self.lock:
                if not batch[0][1].cancel.is_set() and not self._closed:
                    self._companions(batch)
                return self._as_batch(batch)
        # A lone job waits up to --batch-wait-ms for company; every job queued meanwhile wakes us.
        deadline = time.monotonic() + self.batch_wait
        while (left := deadline - time.monotonic()) > 0:
            try:
                self._tokens.get(timeout=left)
            except queue.Empty:
                break
            with self.lock:
                if batch[0][1].cancel.is_set() or self._closed:
                    break  # it ends at once, alone
                self._companions(batch)
                if len(batch) >= self.max_batch:
                    break
        with self.lock:
            if not batch[0][1].cancel.is_set():
                self._companions(batch)
            return self._as_batch(batch)

    def _loop_barrier(self, lane: Lane) -> None:
        """Until the event loop of ``lane`` has gone round twice (at most :data:`BARRIER_TIMEOUT`).

        The first pass runs behind what the loop is doing now (the frames of one read are
        handed over in one go), the second behind the reads that were ready by then, so a
        burst already in the connection's buffers is queued when this returns.  Microseconds
        on an idle loop: a lone request is not held back measurably.
        """
        passed = threading.Event()
        post = lane.output.post

        def first() -> None:
            post(passed.set)

        post(first)
        passed.wait(BARRIER_TIMEOUT)

    def _batches(self, job: Job) -> bool:
        """Whether ``job`` may start a batch: a ``synthesize`` for a loaded engine that batches."""
        return self.max_batch > 1 and job.kind == "synthesize" and self.engine.loaded

    def _as_batch(self, batch: list[tuple[Lane, Job]]) -> list[tuple[Lane, Job]]:
        if len(batch) > 1 or self.joins:
            for _, job in batch:
                job.batched = True
        return batch

    def _joiners(self, batch: list[tuple[Lane, Job]], live: int, room: int) -> list[tuple[Job, JobOutput]]:
        """``synthesize`` jobs that join the running ``batch`` now (``live`` of it not ended), at
        most ``room``.  None once another kind of job waits at a lane's head (the batch drains so
        that it runs) or the scheduler is closing.  Engine thread.
        """
        with self.lock:
            room = min(room, self.max_batch - live)
            if room <= 0 or self._closed:
                return []
            for lane in self._lanes:
                if lane.waiting and lane.waiting[next(iter(lane.waiting))].kind != "synthesize":
                    return []
            before = len(batch)
            self._companions(batch, before + room)
            joined = self._as_batch(batch[before:])
            return [(job, lane.output) for lane, job in joined]

    def _main(self) -> None:
        while True:
            work = self._take()
            if work is None:
                return
            if work:
                if len(work) == 1 and not work[0][1].batched:
                    self._run(*work[0])
                else:
                    self._run_batch(work)
                if any(lane.waiting for lane in self._lanes) or self._closed:
                    continue  # (read without the lock: a job queued after this has its token)
            # A token per job queued, or on close; one left by a job cancelled while
            # queued, or taken into a batch, only wakes us to find nothing.
            self._tokens.get()

    def _end(self, lane: Lane, job: Job, terminal: Any) -> None:
        """``job`` ended on the engine thread: its terminal frame, unless it has one, and its lane's idle event."""
        with self.lock:
            if job in lane.active:
                lane.active.remove(job)
            lane.output.finish(job, terminal)
            idle = None
            if not lane.active:
                idle, lane.idle_waiter = lane.idle_waiter, None
        if idle is not None:
            lane.output.post(idle.set)

    def _run(self, lane: Lane, job: Job) -> None:
        """Run one job to its end and send its terminal frame; on the engine thread."""
        job.started = time.monotonic()
        try:
            terminal = execute(self.engine, job, lane.output)
        except Exception as exc:  # a bug here must still end the request
            log.exception("internal error running request %d", job.id)
            terminal = Error(code="internal", id=job.id, message=f"{type(exc).__name__}: {exc}")
        self._end(lane, job, terminal)

    def _run_batch(self, batch: list[tuple[Lane, Job]]) -> None:
        """Run ``synthesize`` jobs as one batch; each ends with its own terminal frame.  Engine thread.

        When the engine joins batches, ``batch`` grows as jobs join it (:meth:`_joiners`).
        """
        ended = [False] * len(batch)

        def end(index: int, terminal: Any) -> None:
            ended[index] = True
            self._end(*batch[index], terminal)

        def take(room: int) -> list[tuple[Job, JobOutput]]:
            with self.lock:  # a job the event loop cancelled has its terminal frame: no longer live
                live = sum(not done and not job.finished for done, (_, job) in zip(ended, batch, strict=True))
                joined = self._joiners(batch, live, room)
                ended.extend([False] * len(joined))
            return joined

        try:
            execute_batch(self.engine, [(job, lane.output) for lane, job in batch], end, take if self.joins else None)
        except Exception as exc:  # a bug here must still end every request
            log.exception("internal error running a batch")
            error: Union[Exception, None] = exc
        else:
            error = None
        for index, (lane, job) in enumerate(batch):
            if not ended[index]:  # a bug: every job of a batch ends in execute_batch
                reason = f"{type(error).__name__}: {error}" if error is not None else "the batch lost it"
                self._end(lane, job, Error(code="internal", id=job.id, message=reason))
