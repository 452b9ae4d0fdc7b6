"""The client's supervisor: spawns the sidecar, restarts it within a budget, stops it cleanly.

Each sidecar lifetime is a *session*, a task that opens the client's transport (spawns
the child, connects to a socket, or adopts the given streams: ``_transports.py``), drains
stderr, runs the :class:`Connection`, waits for ``ready``, and at the end runs the
bounded, shielded stop ladder (``_process.py``) and leaves the transport, which reaps the
child.  When a session ends on its own, the next call starts another as the restart
budget (``_restarts.py``) allows.  Sessions live in the task group of the supervisor's
*root task*, which runs outside the caller's cancel scopes (a trio system task, or a
plain asyncio task), so ``start()`` and ``aclose()`` need not be nested like a context
manager, and a child is reaped even when the event loop ends without ``aclose()``.
Callers never run that machinery in their own task: they wait on the session's events,
so cancelling a caller only ever abandons what it waited for.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import signal
from typing import TYPE_CHECKING, Union

import anyio
from anyio.abc import TaskGroup

from .._exceptions import (
    AuthenticationError,
    ClosedError,
    RequestTimeoutError,
    RestartLimitError,
    SidecarError,
    StartError,
    fresh,
    unwrap,
)
from .._types import SidecarInfo
from .._wire._connection import Connection
from .._wire._handshake import LossInfo
from ._detached import spawn_detached
from ._process import SidecarProcess, stop_sidecar
from ._restarts import summary
from ._settings import SidecarSettings
from ._transports import Link, Transport

if TYPE_CHECKING:
    from indextts_sidecar.protocol.address import Address

__all__ = ["Supervisor"]


log = logging.getLogger("indextts_client")

_NEW, _STARTING, _RUNNING, _CLOSING, _CLOSED = "new", "starting", "running", "closing", "closed"
#: Seconds the reader gets to read what a stopped or exited child wrote last, before it is aborted.
_READER_DRAIN = 1.0


async def _first_set(*events: anyio.Event, limit: Union[float, None] = None) -> Union[anyio.Event, None]:
    """The first of ``events`` to be set (the earliest listed if several are), or None on timeout."""
    for event in events:
        if event.is_set():
            return event
    result: list[anyio.Event] = []
    with anyio.move_on_after(math.inf if limit is None else limit):
        async with anyio.create_task_group() as tg:

            async def watch(event: anyio.Event) -> None:
                await event.wait()
                result.append(event)
                tg.cancel_scope.cancel()

            for event in events:
                tg.start_soon(watch, event)
    return result[0] if result else None


class _Session:
    """One sidecar lifetime."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.resolved = anyio.Event()  # ready, or failed to start
        self.stop_requested = anyio.Event()
        self.finished = anyio.Event()  # everything reaped and closed
        self.failure: Union[BaseException, None] = None
        self.failed_at: Union[float, None] = None
        self.conn: Union[Connection, None] = None
        self.child: Union[SidecarProcess, None] = None

    @property
    def usable(self) -> bool:
        return (
            self.resolved.is_set()
            and self.failure is None
            and self.conn is not None
            and self.conn.accepting
            and not self.stop_requested.is_set()
        )

    def fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            self.failed_at = anyio.current_time()

    @property
    def reason(self) -> Union[BaseException, None]:
        """What ended this session, if it ended on its own."""
        if self.failure is not None:
            return self.failure
        if self.conn is not None and self.conn.error is not None:
            return self.conn.error
        if self.conn is not None and self.conn.ending is not None:
            return self.conn.ending
        return None

    @property
    def ended_at(self) -> Union[float, None]:
        if self.failed_at is not None:
            return self.failed_at
        return None if self.conn is None else self.conn.closed_at


class Supervisor:
    """The sessions of one :class:`Client`: its root task, restarts, heartbeat and stop ladder.

    It hands out the current :class:`Connection` (:meth:`connection`), starting a new
    session first when the last one ended, within the restart budget.  The client reads
    the rest of its state from here: ``state``, ``restarts``, ``dead``, ``last_info``,
    ``last_pid``, :attr:`stderr_tail`.
    """

    def __init__(self, transport: Transport, settings: SidecarSettings) -> None:
        #: How each session reaches the sidecar.
        self.transport = transport
        self.settings = settings
        self._budget = settings.restart_budget()
        self._ids = itertools.count(1)
        #: new, starting, running, closing or closed.
        self.state = _NEW
        self._tg: Union[TaskGroup, None] = None
        self._root_up = anyio.Event()
        self._root_stop = anyio.Event()
        self._root_done = anyio.Event()
        self._spawn_lock = anyio.Lock()
        self._session: Union[_Session, None] = None
        self._sessions: set[_Session] = set()
        self._session_numbers = itertools.count(1)
        #: The latest ``ready`` frame's facts, and the latest child's pid.
        self.last_info: Union[SidecarInfo, None] = None
        self.last_pid: Union[int, None] = None
        self._last_tail = ""
        #: Restarts so far (not counting the first start).
        self.restarts = 0

    @property
    def url(self) -> Union[Address, None]:
        """The address of a listening sidecar, or None."""
        return self.transport.url

    @property
    def dead(self) -> Union[RestartLimitError, None]:
        """The error every call raises once the restart budget is spent, else None."""
        return self._budget.dead

    @property
    def dead_at(self) -> Union[float, None]:
        """When (``anyio.current_time()``) ``dead`` was last set, else None."""
        return self._budget.dead_at

    @property
    def closed(self) -> bool:
        return self.state in (_CLOSING, _CLOSED)

    @property
    def stderr_tail(self) -> str:
        """The last lines the latest sidecar wrote to stderr, redacted."""
        session = self._session
        if session is not None and session.child is not None:
            return session.child.stderr.tail()
        return self._last_tail

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the root task and the first session, and wait for ``ready`` (:meth:`Client.start`)."""
        if self.state != _NEW:
            raise RuntimeError(f"start() on a client that is {self.state}")
        self.state = _STARTING
        try:
            self._root_up = anyio.Event()
            self._root_stop = anyio.Event()
            self._root_done = anyio.Event()
            spawn_detached(self._root, "indextts_client root")
            await self._root_up.wait()
            async with self._spawn_lock:
                await self._spawn()
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._stop_root()
            if self.state == _STARTING:
                self.state = _NEW
            leaf = unwrap(exc)
            if leaf is exc:
                raise
            raise leaf from None
        if self.state == _STARTING:
            self.state = _RUNNING

    async def aclose(self) -> None:
        """Stop every session and the root task, shielded; idempotent (:meth:`Client.aclose`)."""
        if self.state in (_NEW, _CLOSED):
            self.state = _CLOSED
            return
        self.state = _CLOSING
        try:
            with anyio.CancelScope(shield=True):
                await self._stop_root()
        finally:
            self.state = _CLOSED
        # Re-raise a cancellation that arrived during the shielded cleanup.
        await anyio.lowlevel.checkpoint()

    async def restart(self) -> None:
        """Replace the current session now, with no backoff, and revive a dead client (:meth:`Client.restart`)."""
        if not self.transport.restartable:
            raise RuntimeError("a client over given streams cannot restart its sidecar")
        if self.state in (_CLOSING, _CLOSED):
            raise ClosedError("the client is closed")
        if self.state != _RUNNING:
            raise RuntimeError("the client is not started: use 'async with Client(...)' or 'await client.start()'")
        async with self._spawn_lock:
            previous = self._session
            if previous is not None:
                previous.stop_requested.set()
                with anyio.CancelScope(shield=True):
                    await previous.finished.wait()
            self._budget.reset()
            log.info("restarting the sidecar on request")
            await self._spawn()

    async def revive(self) -> None:
        """Try once to bring a dead client back (a :class:`Pool` healing a member).

        A new session, counted in ``restarts``; on success the restart budget starts
        afresh.  On failure the client stays dead (``dead_at`` is now) and the failure is
        raised.  Nothing to do when the client is not dead.
        """
        if self.state in (_CLOSING, _CLOSED):
            raise ClosedError("the client is closed")
        if self.state != _RUNNING or not self.transport.restartable:
            return
        async with self._spawn_lock:
            if self.dead is None:
                return
            previous = self._session
            if previous is not None:
                previous.stop_requested.set()
                with anyio.CancelScope(shield=True):
                    await previous.finished.wait()
            self.restarts += 1
            log.warning(
                "%s (restart %d) after the restart limit",
                "reviving the sidecar" if self.url is None else f"reconnecting to {self.url}",
                self.restarts,
            )
            try:
                await self._spawn()
            except SidecarError as exc:
                self._budget.revive_failed(exc, anyio.current_time())
                raise
            self._budget.reset()

    def is_alive(self) -> bool:
        """Whether the current session is ready and its child running (:meth:`Client.is_alive`)."""
        session = self._session
        if self.state != _RUNNING or self.dead is not None or session is None or not session.usable:
            return False
        return session.child is None or session.child.running

    async def _root(self) -> None:
        """The root task: hosts the sessions' task group until the client stops."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._root_up.set()
                await self._root_stop.wait()
                tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            raise  # the event loop is ending; the sessions have reaped their children
        except BaseException:  # a root task must never raise into the event loop
            log.exception("internal error in the client's root task")
        finally:
            self._tg = None
            self._root_up.set()
            self._root_done.set()

    async def _stop_root(self) -> None:
        """Stop every session (bounded: each runs the stop ladder), then the root task."""
        await self._stop_sessions()
        self._root_stop.set()
        await self._root_done.wait()

    async def _stop_sessions(self) -> None:
        for session in list(self._sessions):
            session.stop_requested.set()
        for session in list(self._sessions):
            await session.finished.wait()

    # ----------------------------------------------------------- supervision

    async def connection(self) -> Connection:
        """The current session's connection; when that session ended, a new one's (a restart)."""
        session = self._session
        if self.state == _RUNNING and session is not None and session.usable:
            assert session.conn is not None
            return session.conn
        async with self._spawn_lock:
            self._check_state()
            session = self._session
            if session is not None and session.usable:
                assert session.conn is not None
                return session.conn
            await self._restart(session)
            assert self._session is not None and self._session.conn is not None
            return self._session.conn

    def _check_state(self) -> None:
        if self.state in (_CLOSING, _CLOSED):
            raise ClosedError("the client is closed")
        if self.state != _RUNNING:
            raise RuntimeError("the client is not started: use 'async with Client(...)' or 'await client.start()'")
        if self.dead is not None:
            raise fresh(self.dead) from self.dead.last_error

    async def _restart(self, previous: Union[_Session, None]) -> None:
        reason: BaseException = ClosedError("the sidecar stopped")
        ended_at = anyio.current_time()
        if previous is not None:
            reason = previous.reason or reason
            ended_at = previous.ended_at or ended_at
        if not self.transport.restartable:
            raise fresh(reason) if isinstance(reason, SidecarError) else ClosedError(str(reason))
        if isinstance(reason, AuthenticationError):
            raise fresh(reason)  # the same token would be refused again
        now = anyio.current_time()
        if self._budget.spent(now):
            dead = self._budget.give_up(reason, now)
            log.error("%s", dead.message)
            raise fresh(dead) from reason
        delay = self._budget.delay(now, ended_at)
        if delay > 0:
            await anyio.sleep(delay)
            self._check_state()
        self._budget.record(anyio.current_time())
        self.restarts += 1
        log.warning(
            "%s (restart %d) after: %s",
            "restarting the sidecar" if self.url is None else f"reconnecting to {self.url}",
            self.restarts,
            summary(reason),
        )
        if self.settings.on_restart is not None:
            try:
                result = self.settings.on_restart(self.restarts, reason)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("on_restart callback failed")
            self._check_state()
        await self._spawn()

    async def _spawn(self) -> None:
        """Start a session and wait until it is ready or failed (the caller holds the spawn lock)."""
        if self._tg is None:
            raise ClosedError("the client is closed")
        session = _Session(next(self._session_numbers))
        self._sessions.add(session)
        self._session = session
        self._tg.start_soon(self._run_session, session)
        try:
            await session.resolved.wait()
        except BaseException:
            # Cancelled while starting: the session kills the child; wait for it.
            session.stop_requested.set()
            with anyio.CancelScope(shield=True):
                await session.finished.wait()
            raise
        if session.failure is not None:
            raise session.failure

    async def _run_session(self, session: _Session) -> None:
        try:
            async with self.transport.open(self.settings) as link:
                session.child = link.child
                if link.child is not None:
                    self.last_pid = link.child.pid
                await self._serve(session, link)
        except Exception as exc:
            exc = unwrap(exc)  # type: ignore[assignment]
            if not isinstance(exc, SidecarError):
                log.exception("internal error in the sidecar session")
                exc = StartError(f"internal error starting the sidecar: {exc!r}")
            session.fail(exc)
        finally:
            if session.child is not None:
                self._last_tail = session.child.stderr.tail()
            if session.failure is None and not session.resolved.is_set():
                session.fail(ClosedError("the sidecar session ended before 'ready'"))
            session.resolved.set()
            self._sessions.discard(session)
            session.finished.set()

    async def _serve(self, session: _Session, link: Link) -> None:
        """Run the connection over ``link`` until it ends or a stop is asked; then stop the sidecar.

        A child of ours goes down the stop ladder (``shutdown`` when the stop was asked);
        a sidecar with no process of ours behind its streams is only disconnected.
        """
        child = link.child
        conn = session.conn = self._new_connection(link)
        try:
            async with anyio.create_task_group() as tg:
                if child is not None:
                    tg.start_soon(child.pump_stderr)
                tg.start_soon(conn.run)
                if child is not None:
                    tg.start_soon(self._watch_exit, child, conn)
                graceful = False
                if await self._handshake(session, conn, child):
                    if self.settings.heartbeat is not None:
                        tg.start_soon(self._beat, child, conn, self.settings.heartbeat)
                    first = await _first_set(conn.closed_event, session.stop_requested)
                    graceful = first is session.stop_requested and not conn.closed
                if child is not None:
                    await self._stop_child(child, conn, graceful=graceful)
                else:
                    conn.mark_closing()
                tg.cancel_scope.cancel()
        finally:
            if child is None:
                with anyio.CancelScope(shield=True):
                    await conn.aclose()

    def _new_connection(self, link: Link) -> Connection:
        child = link.child

        async def describe(kind: str) -> LossInfo:
            assert child is not None
            return await child.describe_loss(kind)

        settings = self.settings
        return Connection(
            link.receive,
            link.send,
            timeout=settings.timeout,
            idle_timeout=settings.idle_timeout,
            ready_timeout=settings.ready_timeout,
            frame_timeout=settings.frame_timeout,
            describe_loss=describe if child is not None else None,
            redact=settings.redact,
            ids=self._ids,
            max_buffered=settings.max_buffered,
            token=settings.token,
        )

    async def _handshake(self, session: _Session, conn: Connection, child: Union[SidecarProcess, None]) -> bool:
        """Wait for ``ready``; on failure record it in the session.  Returns whether ready."""
        first = await _first_set(
            conn.ready_event, conn.closed_event, session.stop_requested, limit=self.settings.ready_timeout
        )
        if conn.ready is not None and not conn.closed and first is conn.ready_event:
            self.last_info = conn.info
            session.resolved.set()
            log.info(
                "sidecar ready: engine %s, pid %d, protocol %d", conn.ready.engine, conn.ready.pid, conn.ready.protocol
            )
            return True
        if first is conn.closed_event or conn.closed:
            error = conn.error
            assert error is not None
            session.fail(fresh(error))
        elif first is session.stop_requested:
            session.fail(ClosedError("the client was closed while the sidecar was starting"))
        else:
            tail = child.stderr.tail() if child is not None else ""
            session.fail(
                StartError(
                    f"the sidecar sent no 'ready' frame within {self.settings.ready_timeout:g} s (ready_timeout)",
                    stderr_tail=tail,
                )
            )
        session.resolved.set()
        return False

    async def _stop_child(self, child: SidecarProcess, conn: Connection, *, graceful: bool) -> None:
        """Stop a child of ours down the stop ladder (``shutdown`` first when ``graceful``).

        Then the connection reads what is left (it ends at EOF) and stops.  When the stream
        had ended first, ``describe_loss`` already gave the child time to exit.
        """

        async def shutdown() -> None:
            try:
                await conn.shutdown()
            except SidecarError as exc:
                log.debug("shutdown request failed: %s", exc)

        with anyio.CancelScope(shield=True):
            conn.mark_closing()
            await stop_sidecar(child, self.settings.shutdown_timeout, shutdown=shutdown if graceful else None)
            with anyio.move_on_after(_READER_DRAIN):
                await conn.closed_event.wait()
            conn.abort("the sidecar was stopped")

    async def _beat(self, child: Union[SidecarProcess, None], conn: Connection, interval: float) -> None:
        """Ping every ``interval`` s; after ``heartbeat_misses`` pings in a row without a pong, kill.

        A sidecar on a socket (no ``child``) is not ours to kill: the connection is dropped,
        and the next call reconnects.
        """
        misses = 0
        while conn.accepting:
            began = anyio.current_time()
            try:
                await conn.heartbeat(interval)
            except RequestTimeoutError:
                misses += 1
                if misses < self.settings.heartbeat_misses:
                    continue
                if child is None:
                    reason = (
                        f"no pong to {misses} heartbeats in a row ({interval:g} s each): "
                        f"the sidecar at {self.url} is hung or unreachable; the connection was dropped"
                    )
                    log.error("%s", reason)
                else:
                    reason = (
                        f"no pong to {misses} heartbeats in a row ({interval:g} s each): "
                        "the sidecar is hung or stopped; it was killed"
                    )
                    log.error("sidecar pid %d: %s", child.pid, reason)
                    child.signal_group(signal.SIGKILL)
                conn.abort(reason)
                return
            except SidecarError:
                return  # the connection ended; the session handles it
            misses = 0
            await anyio.sleep(max(0.0, began + interval - anyio.current_time()))

    async def _watch_exit(self, child: SidecarProcess, conn: Connection) -> None:
        """When the child exits, make sure the connection notices even if its stdout stays open."""
        await child.process.wait()
        with anyio.move_on_after(_READER_DRAIN):
            await conn.reader_done.wait()
        conn.abort(f"the sidecar exited (returncode {child.process.returncode})")
