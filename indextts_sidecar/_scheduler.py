"""The engine thread and the queues that feed it.

Engines wrap libraries that are not thread-safe and that keep per-thread state (CUDA
streams, caches), so one long-lived thread makes every engine call, one at a time.  It
takes its next job itself, round robin over the queues of the connections attached
(over stdio one; over a socket one per connection), so no connection starves another
and no event loop turn is spent between two jobs.

One lock, :attr:`Scheduler.lock`, guards every queue and every job's ``finished`` flag:
the event loop (dispatch, cancel, stop) and the engine thread (start, finish) decide
under it.  What they write under it goes through the :class:`~._outbox.Outbox`, which
never blocks; waiting for room (an audio slot) happens outside it.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Protocol, Union

from . import protocol
from .engines import Engine, SynthesisRequest

__all__ = ["Flag", "Job", "Scheduler"]


class Flag:
    """A flag one thread sets and another polls (``threading.Event`` without its Condition: nobody waits on it)."""

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
        "cancel",
        "cancel_code",
        "enqueued",
        "finished",
        "id",
        "kind",
        "last_frame",
        "quiet",
        "request",
        "started",
    )

    def __init__(
        self, request_id: int, kind: str, request: Union[SynthesisRequest[Any], None] = None, *, quiet: bool = False
    ) -> None:
        self.id = request_id
        self.kind = kind
        self.request = request
        #: Set to stop the job; engines poll it between steps.
        self.cancel = Flag()
        #: The error code the job ends with once ``cancel`` is set.
        self.cancel_code = "cancelled"
        self.enqueued = time.monotonic()
        self.started = 0.0
        #: Its terminal frame is sent (guarded by the scheduler's lock).
        self.finished = False
        #: The parent asked for no progress: only a sign of life after a quiet spell goes out.
        self.quiet = quiet
        #: When the last frame of the job went out (``time.monotonic``), for ``quiet``.
        self.last_frame = self.enqueued


class Served(Protocol):
    """What the scheduler needs of a connection (:class:`~._server.Server`)."""

    queue: dict[int, Job]
    active: Union[Job, None]

    def run_job(self, job: Job) -> None: ...

    def send(self, message: protocol.Reply) -> None: ...


class Scheduler:
    """One engine thread, fed round robin from the queues of the connections attached to it."""

    def __init__(self, engine: Engine[Any, Any]) -> None:
        self.engine = engine
        self.started = time.monotonic()
        #: Guards every attached queue, each connection's ``active`` job and every ``Job.finished``.
        self.lock = threading.RLock()
        self.servers: list[Served] = []
        self._turn = 0
        self._closed = False
        # One token per job queued (or on close): the engine thread sleeps in a C-level
        # queue, one futex away, instead of a Python Condition.
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="indextts-engine", daemon=True)

    def attach(self, server: Served) -> None:
        with self.lock:
            self.servers.append(server)
            if not self._thread.is_alive() and not self._closed:
                self._thread.start()

    def detach(self, server: Served) -> None:
        with self.lock:
            if server in self.servers:
                self.servers.remove(server)

    def notify(self) -> None:
        """A queue gained a job."""
        self._tokens.put(None)

    def close(self) -> None:
        """Let the engine thread end after its current job."""
        with self.lock:
            self._closed = True
        self._tokens.put(None)

    def _pick(self) -> Union[tuple[Served, Job], None]:
        count = len(self.servers)
        for step in range(count):
            index = (self._turn + step) % count
            server = self.servers[index]
            if server.queue:
                # The next turn starts after this connection: round robin.
                self._turn = index + 1
                job_id = next(iter(server.queue))
                job = server.queue.pop(job_id)
                server.active = job
                return server, job
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
                server, job = picked
                server.run_job(job)
