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
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any, Union

import anyio

from ._jobs import Job, JobOutput, execute, shutting_down
from .engines import Engine
from .protocol import Error

__all__ = ["Job", "Lane", "Scheduler"]

log = logging.getLogger("indextts_sidecar")


class Lane:
    """One connection's jobs at the scheduler: those waiting, in order, and the one running."""

    __slots__ = ("idle_waiter", "output", "running", "waiting")

    def __init__(self, output: JobOutput) -> None:
        self.output = output
        #: Waiting for the engine thread, oldest first.
        self.waiting: dict[int, Job] = {}
        self.running: Union[Job, None] = None
        #: Set (on the event loop) when the running job ends, if the event loop waits for that.
        self.idle_waiter: Union[anyio.Event, None] = None

    @property
    def depth(self) -> int:
        """Jobs waiting, not counting the running one (read without the lock: a health figure)."""
        return len(self.waiting)


class Scheduler:
    """One engine thread, fed round robin from the lanes of the connections attached to it."""

    def __init__(self, engine: Engine[Any, Any]) -> None:
        self.engine = engine
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
        while queued); a running one is told to stop and ends on the engine thread, in order.
        """
        with self.lock:
            job = lane.waiting.pop(job_id, None)
            if job is not None:
                if reason is None:
                    reason = Error(code="cancelled", id=job_id, message="cancelled while queued")
                lane.output.finish(job, reason)
                return True
            running = lane.running
            if running is not None and running.id == job_id and not running.finished:
                running.cancel.set()
                return True
        return False

    def stop_all(self, lane: Lane, code: str = "shutting_down") -> Union[anyio.Event, None]:
        """End ``lane``'s waiting jobs (``shutting_down``) and tell its running one to stop.

        Returns an event set once the running job has ended, or None when none runs.  Loop thread.
        """
        with self.lock:
            for job in list(lane.waiting.values()):
                del lane.waiting[job.id]
                lane.output.finish(job, shutting_down(job))
            running = lane.running
            if running is None:
                return None
            running.cancel_code = code
            running.cancel.set()
            return self._idle_event(lane)

    def until_idle(self, lane: Lane) -> Union[anyio.Event, None]:
        """None if ``lane`` has nothing waiting or running; else an event set when its running job ends
        (wait, then ask again).  Loop thread."""
        with self.lock:
            if not lane.waiting and lane.running is None:
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
        count = len(self._lanes)
        for step in range(count):
            index = (self._turn + step) % count
            lane = self._lanes[index]
            if lane.waiting:
                # The next turn starts after this connection: round robin.
                self._turn = index + 1
                job = lane.waiting.pop(next(iter(lane.waiting)))
                lane.running = job
                return lane, job
        return None

    def _main(self) -> None:
        while True:
            # A token per job; one left by a job cancelled while queued finds nothing.
            self._tokens.get()
            with self.lock:
                if self._closed:
                    return
                picked = self._pick()
            if picked is not None:
                self._run(*picked)

    def _run(self, lane: Lane, job: Job) -> None:
        """Run one job to its end and send its terminal frame; on the engine thread."""
        job.started = time.monotonic()
        try:
            terminal = execute(self.engine, job, lane.output)
        except Exception as exc:  # a bug here must still end the request
            log.exception("internal error running request %d", job.id)
            terminal = Error(code="internal", id=job.id, message=f"{type(exc).__name__}: {exc}")
        with self.lock:
            lane.running = None
            lane.output.finish(job, terminal)
            idle, lane.idle_waiter = lane.idle_waiter, None
        if idle is not None:
            lane.output.post(idle.set)
