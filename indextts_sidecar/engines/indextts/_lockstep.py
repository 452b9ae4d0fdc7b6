"""Several of upstream's generators driven in lockstep, so that their model calls can be batched.

Upstream's ``infer_generator`` runs one request from its references to its last segment, and
calls its GPT, its s2mel CFM and its vocoder deep inside, one request at a time.  To batch
those calls across requests without copying upstream's code, each request's generator runs
in a thread of its own, and the calls to batch are intercepted on the model instance (see
:mod:`._batched`): an intercepted call parks the thread and hands the call to the
coordinator, which runs the parked calls of every request as one batch and hands each thread
its own row.

Exactly one thread runs at any time, the coordinator or one worker, so upstream's instance
(which is not thread-safe) is never used by two threads at once; each hand-over goes through
one lock, which orders every write before the next thread's reads.  Workers may be added while
the others run (:meth:`Lockstep.add`, a request joining a running batch): only the coordinator
adds, between steps, so that rule holds for them too.  This module knows
nothing of torch or of upstream: it runs generators, parks calls and delivers results.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = ["Abort", "Blocked", "Call", "Chunk", "End", "Failed", "Lockstep", "Report"]


class Abort(BaseException):
    """Raised inside a worker, at the call it is parked on, to unwind upstream's generator.

    A BaseException, so that upstream's ``except Exception`` clauses let it through."""


@dataclass
class Call:
    """One intercepted call: ``kind`` says which model call, ``key`` which calls may share a batch."""

    kind: str
    key: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any = None
    error: Union[BaseException, None] = None


@dataclass(frozen=True)
class Chunk:
    """The worker's generator yielded ``value``."""

    value: Any


@dataclass(frozen=True)
class Blocked:
    """The worker is parked on ``call``: set its result (or error) before its next step."""

    call: Call


@dataclass(frozen=True)
class End:
    """The worker's generator is exhausted (or was aborted)."""


@dataclass(frozen=True)
class Failed:
    """The worker's generator raised ``error``."""

    error: BaseException


Report = Union[Chunk, Blocked, End, Failed]


@dataclass
class _Worker:
    index: int
    start: Callable[[], Iterator[Any]]
    thread: Union[threading.Thread, None] = None
    report: Union[Report, None] = None
    abort: bool = False
    done: bool = False
    parked: Union[Call, None] = field(default=None)


class Lockstep:
    """Runs ``starts[i]()`` (a generator factory) in worker thread ``i``, one step at a time.

    :meth:`step` lets one worker run until its next report: a chunk its generator yielded,
    a call it parked on (:meth:`park`, from an interceptor on that worker's thread), its end
    or its error.  :meth:`add` appends a worker, :meth:`close` aborts every worker still alive
    and joins them all; each is called by the coordinator, as :meth:`step` is.
    """

    def __init__(self, starts: Sequence[Callable[[], Iterator[Any]]] = (), name: str = "indextts-batch") -> None:
        self._workers = [_Worker(i, start) for i, start in enumerate(starts)]
        self._lock = threading.Condition()
        self._running: Union[int, None] = None  # the worker allowed to run; None: the coordinator
        self._name = name
        self._local = threading.local()
        self._closed = False

    def __len__(self) -> int:
        return len(self._workers)

    def add(self, start: Callable[[], Iterator[Any]]) -> int:
        """A new worker (its thread starts at its first :meth:`step`); returns its index.

        Called by the coordinator, which is the one thread running: no worker reads the list
        meanwhile.  Refused once :meth:`close` began (nothing would abort the new worker).
        """
        if self._closed:
            raise RuntimeError("the lockstep is closed: no worker can join it")
        index = len(self._workers)
        self._workers.append(_Worker(index, start))
        return index

    def alive(self, index: int) -> bool:
        return not self._workers[index].done

    # ------------------------------------------------------------ coordinator side

    def step(self, index: int) -> Report:
        """Let worker ``index`` run until its next report, and return that report."""
        worker = self._workers[index]
        if worker.done:
            return End()
        parked = worker.parked
        if parked is not None and parked.result is None and parked.error is None and not worker.abort:
            raise RuntimeError(f"worker {index} is parked on a {parked.kind} call without a result")
        with self._lock:
            if worker.thread is None:
                worker.thread = threading.Thread(
                    target=self._main, args=(worker,), name=f"{self._name}-{index}", daemon=True
                )
                self._running = index
                worker.thread.start()
            else:
                self._running = index
                self._lock.notify_all()
            while self._running is not None:
                self._lock.wait()
            report = worker.report
            worker.report = None
        assert report is not None
        if isinstance(report, (End, Failed)):
            worker.done = True
            assert worker.thread is not None
            worker.thread.join()
        return report

    def abort(self, index: int) -> Report:
        """Unwind worker ``index`` (``Abort`` raised where it is parked); returns its last report."""
        worker = self._workers[index]
        if worker.done:
            return End()
        worker.abort = True
        if worker.thread is None:
            worker.done = True
            return End()
        return self.step(index)

    def close(self) -> None:
        """Abort every live worker and join them (idempotent)."""
        self._closed = True
        for worker in self._workers:
            while not worker.done:
                self.abort(worker.index)

    # ------------------------------------------------------------ worker side

    def current(self) -> Union[int, None]:
        """The index of the worker this thread is, or None (not one of this lockstep's workers)."""
        return getattr(self._local, "index", None)

    def park(self, call: Call) -> Any:
        """From an interceptor on a worker's thread: hand ``call`` over and wait for its result."""
        worker = self._workers[self._local.index]
        worker.parked = call
        self._yield_turn(worker, Blocked(call))
        worker.parked = None
        if call.error is not None:
            raise call.error
        return call.result

    def _yield_turn(self, worker: _Worker, report: Report) -> None:
        with self._lock:
            worker.report = report
            self._running = None
            self._lock.notify_all()
            while self._running != worker.index:
                self._lock.wait()
        if worker.abort:
            raise Abort

    def _finish(self, worker: _Worker, report: Report) -> None:
        with self._lock:
            worker.report = report
            self._running = None
            self._lock.notify_all()

    def _main(self, worker: _Worker) -> None:
        self._local.index = worker.index
        report: Report = End()
        chunks: Union[Iterator[Any], None] = None
        try:
            if worker.abort:
                raise Abort
            chunks = worker.start()
            for value in chunks:
                self._yield_turn(worker, Chunk(value))
        except Abort:
            report = End()
        except BaseException as exc:  # reported to the coordinator, which decides
            report = Failed(exc)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                try:
                    close()
                except BaseException as exc:  # an error while unwinding: report it unless one is already
                    if isinstance(report, End) and not worker.abort:
                        report = Failed(exc)
            self._finish(worker, report)
