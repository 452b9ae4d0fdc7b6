"""An event loop in a daemon thread that other threads hand calls to, safe under Ctrl-C.

:class:`BlockingClient` runs its :class:`Client` here.  anyio's ``BlockingPortal`` would
do, but for one trap: a thread that hands it a call waits on a
``concurrent.futures.Future``, whose ``threading.Condition`` is entered through a
Python-level ``__enter__``.  A KeyboardInterrupt raised in that thread just after the C
acquire inside it (Python checks for signals there) leaves the lock held; the loop blocks
for good the next time it completes that future, and so does every later call.  A Ctrl-C
in a waiting script hung it that way in CI, about once in a hundred.

Here a waiting thread touches no lock the loop takes.  It hands a call over by appending
it to a deque and waking the loop through the backend's own non-blocking scheduler
(``call_soon_threadsafe``, ``run_sync_soon``); it waits on a plain lock of its own (C,
no ``__enter__``) that the loop releases once the call has ended, waking every
:data:`POLL` seconds so that a signal the kernel handed to the loop's thread is seen
too.  A call taken back (:meth:`LoopCall.abandon`, on any exception in the waiting
thread) is cancelled where it runs, or never starts.
"""

from __future__ import annotations

import collections
import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Union

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ._exceptions import ClosedError

__all__ = ["CANCEL_GRACE", "POLL", "LoopCall", "LoopThread"]

#: Seconds between a waiting thread's checks for a signal (Ctrl-C) while a call runs.
POLL = 0.1
#: How long a call taken back may take to end on the loop (its request's cancel written,
#: a starting sidecar stopped) before the waiting thread goes on anyway.
CANCEL_GRACE = 5.0

_Fn = Callable[[], Union[Awaitable[Any], Any]]


class LoopCall:
    """One call from a thread to the loop: its outcome, and a way to take it back."""

    def __init__(self, fn: _Fn) -> None:
        self._fn = fn
        #: Released by the loop once the call has ended (or will never run).
        self._done = threading.Lock()
        self._done.acquire()
        self.finished = False
        self._value: Any = None
        self._error: Union[BaseException, None] = None
        # Read and written on the loop only.
        self._scope: Union[anyio.CancelScope, None] = None
        self._dispatched = False
        self._abandoned = False

    async def run(self) -> None:
        """Run the call (a task of the loop's task group); a call already taken back does nothing."""
        if self._abandoned:
            self._end()
            return
        try:
            with anyio.CancelScope() as self._scope:
                result = self._fn()
                self._value = await result if inspect.isawaitable(result) else result
        except anyio.get_cancelled_exc_class():
            # The loop is stopping (close() from another thread): the waiter sees the client closed.
            self._error = ClosedError("the client was closed while the call ran")
            raise
        except BaseException as exc:
            self._error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self._end()

    def fail(self, error: Union[BaseException, None]) -> None:
        """End a call that will never run (the loop ended first, or it was never handed over)."""
        if not self.finished:
            self._error = error
            self._end()

    def _end(self) -> None:
        self.finished = True
        self._done.release()

    def wait(self, timeout: Union[float, None] = None) -> Any:
        """Its result, or its exception raised here; blocks until the call has ended."""
        if not _acquire(self._done, timeout):
            raise TimeoutError("the call did not end in time")
        error = self._error
        if error is not None:
            raise error
        return self._value

    def take_back(self, *, queued: bool) -> bool:
        """On the loop: cancel the call if it runs, or keep it from running; whether it must be started to end."""
        self._abandoned = True
        if self._scope is not None:
            self._scope.cancel()
            return False
        if self._dispatched or queued:
            return True  # it starts, sees it was taken back, and ends at once
        self.fail(None)  # never handed over
        return False

    def dispatched(self) -> None:
        """On the loop: the call is about to start as a task of the loop."""
        self._dispatched = True

    def abandon(self, loop: LoopThread) -> None:
        """Cancel the call on the loop (or keep it from starting) and wait, bounded, until it has ended."""
        if self.finished:
            return
        try:
            loop.schedule(functools.partial(loop.take_back, self))
        except RuntimeError:  # the loop has ended: the call ends with it
            return
        _acquire(self._done, CANCEL_GRACE)


class LoopThread:
    """An anyio event loop (``asyncio`` or ``trio``) in a daemon thread, fed calls from other threads."""

    def __init__(self, backend: str, backend_options: Union[dict[str, Any], None], *, name: str) -> None:
        self._backend = backend
        self._backend_options = backend_options
        #: Calls handed over and not yet started; ``None`` asks the loop to stop.
        self._pending: collections.deque[Union[LoopCall, None]] = collections.deque()
        self._native_schedule: Union[Callable[[Callable[[], object]], object], None] = None
        self._wake: Union[anyio.Event, None] = None
        self._group: Union[TaskGroup, None] = None
        #: Released once the loop runs, or once it failed to start (``_failure``).
        self._started = threading.Lock()
        self._started.acquire()
        self._signalled = False
        self._failure: Union[BaseException, None] = None
        self._ended = False
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    # -------------------------------------------------------------- any thread

    def start(self) -> None:
        """Start the thread and wait until its loop runs (or raise why it could not start)."""
        self.thread.start()
        _acquire(self._started, None)
        if self._failure is not None:
            self.thread.join()
            raise self._failure

    def schedule(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the loop soon (not in a task); never blocks.  RuntimeError once the loop ended."""
        native = self._native_schedule
        if native is None or self._ended:
            raise RuntimeError("the event loop thread is not running")
        native(callback)

    def submit(self, call: LoopCall) -> None:
        """Hand ``call`` to the loop; never blocks.  RuntimeError once the loop ended."""
        if self._ended:
            raise RuntimeError("the event loop thread is not running")
        self._pending.append(call)
        self.schedule(self._wake_up)

    def run(self, fn: _Fn) -> Any:
        """Run ``fn`` (sync or async) on the loop and return its result; an exception here cancels it there."""
        call = LoopCall(fn)
        try:
            self.submit(call)
            return call.wait()
        except BaseException:
            # KeyboardInterrupt (Ctrl-C) or another exception raised in this thread while it
            # waited: the call must not run on unseen.  Cancelling it on the loop cancels the
            # request on the sidecar; wait (bounded) until that is done, then re-raise.
            call.abandon(self)
            raise

    def stop(self, timeout: Union[float, None] = None) -> bool:
        """Cancel what still runs, end the loop and wait for the thread; whether it ended in time."""
        if not self._ended:
            self._pending.append(None)
            try:
                self.schedule(self._wake_up)
            except RuntimeError:
                pass
        if threading.get_ident() == self.thread.ident:
            return False  # stopping from a callback on the loop: it ends once that returns
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.thread.is_alive():
            self.thread.join(POLL)
            if deadline is not None and time.monotonic() >= deadline:
                return not self.thread.is_alive()
        return True

    def hold(self, context: AbstractAsyncContextManager[Any]) -> Callable[[], None]:
        """Enter ``context`` in a task of the loop that holds it open; return what leaves it.

        For an async context manager that must be entered and left in one task (it opens a
        task group).  The function returned leaves it and waits until it has; an exception
        its exit raises is raised there.
        """
        left: list[BaseException] = []

        async def host(*, task_status: TaskStatus[tuple[anyio.Event, anyio.Event]]) -> None:
            leave, gone = anyio.Event(), anyio.Event()
            entered = False
            try:
                async with context:
                    entered = True
                    task_status.started((leave, gone))
                    await leave.wait()
            except Exception as exc:
                if not entered:  # raised by the entry: start() raises it in the thread that entered
                    raise
                left.append(exc)  # raised by the exit: reported to the thread that leaves
            finally:
                gone.set()

        async def enter() -> tuple[anyio.Event, anyio.Event]:
            assert self._group is not None
            events: tuple[anyio.Event, anyio.Event] = await self._group.start(host)
            return events

        leave, gone = self.run(enter)

        async def exit_() -> None:
            leave.set()
            await gone.wait()

        def close() -> None:
            self.run(exit_)
            if left:
                raise left[0]

        return close

    # ------------------------------------------------------------- loop thread

    def _main(self) -> None:
        try:
            anyio.run(self._serve, backend=self._backend, backend_options=self._backend_options)
        except BaseException as exc:  # e.g. trio not installed: start() raises it
            self._failure = exc
        finally:
            self._ended = True
            self._signal_started()  # (when it never ran)
            # What was handed over after the stop never runs: its waiters must not wait on.
            while self._pending:
                call = self._pending.popleft()
                if call is not None:
                    call.fail(ClosedError("the client is closed"))

    async def _serve(self) -> None:
        self._wake = anyio.Event()  # for a wake-up before the dispatcher's first step (it drains then)
        self._native_schedule = _native_scheduler(self._backend)
        async with anyio.create_task_group() as group:
            self._group = group
            self._signal_started()
            await self._dispatch(group)
            group.cancel_scope.cancel()

    async def _dispatch(self, group: TaskGroup) -> None:
        # Drain before each wait: what came before the loop could be woken (a stop() from a
        # Ctrl-C while start() waited for the loop) is queued with no wake-up of its own.  The
        # event is renewed before the drain, so a wake-up for a call queued after it is kept.
        while True:
            wake = self._wake = anyio.Event()
            while self._pending:
                call = self._pending.popleft()
                if call is None:
                    return
                call.dispatched()
                group.start_soon(call.run)
            await wake.wait()

    def take_back(self, call: LoopCall) -> None:
        """On the loop: cancel ``call`` if it runs; one not started yet ends without running.

        The thread that handed it over may have been interrupted anywhere in :meth:`submit`:
        the call may be queued without the wake-up that would start it, or not queued at all.
        """
        if call.take_back(queued=call in self._pending):
            self._wake_up()

    def _signal_started(self) -> None:
        if not self._signalled:
            self._signalled = True
            self._started.release()

    def _wake_up(self) -> None:
        assert self._wake is not None
        self._wake.set()


def _acquire(lock: threading.Lock, timeout: Union[float, None]) -> bool:
    """Acquire ``lock`` within ``timeout`` (None: however long), waking every :data:`POLL` s for signals."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not lock.acquire(timeout=POLL):
        if deadline is not None and time.monotonic() >= deadline:
            return False
    return True


def _native_scheduler(backend: str) -> Callable[[Callable[[], object]], object]:
    """The running loop's own thread-safe, non-blocking way to run a callback on it."""
    if backend == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio

    return asyncio.get_running_loop().call_soon_threadsafe
