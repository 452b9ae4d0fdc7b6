"""The transport-agnostic core: one protocol v1 connection over any pair of anyio byte streams.

A :class:`Connection` owns the only frame reader (one task) and the only writer (sends
serialised by a lock, since concurrent sends on one pipe interleave on asyncio and
raise on trio).  The reader never runs user code and never blocks on a consumer: it
decodes each frame and appends it to the inbox of the request whose id it carries.
Each request's frames are consumed, its callbacks run and its deadlines are enforced
in the task awaiting that request (see :mod:`._request_run`); the connection's alarm
(:mod:`._deadlines`) only wakes a waiting request once its deadline has passed.  Requests
use the connection through the public methods of :class:`~._exchange.Channel` only.

When a request is abandoned (its task cancelled, a deadline fired, a callback raised)
the ``cancel`` message is sent and the terminal frame collected in the connection's
own task group, never in the abandoning task.

When the stream ends or framing is lost every pending request fails at once with the
same typed error; an owner (the process supervisor) may describe the loss with the
exit code and stderr tail through ``describe_loss``.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Union

import anyio
import msgspec
from anyio.abc import ByteReceiveStream, ByteSendStream, TaskGroup

from indextts_sidecar import protocol
from indextts_sidecar.protocol.framing import FrameReader, FramingError, TruncatedFrame
from indextts_sidecar.protocol.streams import loop_clock

from .._defaults import DEFAULT_FRAME_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_BUFFERED, DEFAULT_READY_TIMEOUT
from .._exceptions import BufferFullError, ClosedError, SidecarError, StartError, UnreadError, fresh
from .._types import SidecarInfo
from ._deadlines import DeadlineAlarm
from ._exchange import ABANDONED, ENDED, REGISTERED, TERMINAL_KINDS, Exchange, Wakeup, encode_request, wakeup_class
from ._handshake import Loss, LossInfo, error_for_loss, handshake
from ._request import Requester
from ._sender import FrameSender

__all__ = ["Connection"]

log = logging.getLogger("indextts_client")

_Build = Callable[[int], protocol.Request]


def _identity(text: str) -> str:
    return text


class Connection(Requester):
    """Protocol v1 over a byte stream pair: routing by request id, one reader, one writer.

    Use it directly for a sidecar reached over TCP, a Unix socket or in-memory streams::

        async with Connection(receive_stream, send_stream) as conn:
            audio = await conn.synthesize("Hello")

    Entering waits for the ``ready`` handshake (``ready_timeout``); leaving closes both
    streams.  The request methods are those of :class:`~indextts_client.Client`, without
    supervision: after the stream ends every call raises the error that ended it.
    """

    def __init__(
        self,
        receive_stream: ByteReceiveStream,
        send_stream: ByteSendStream,
        *,
        timeout: Union[float, None] = None,
        idle_timeout: Union[float, None] = DEFAULT_IDLE_TIMEOUT,
        ready_timeout: Union[float, None] = DEFAULT_READY_TIMEOUT,
        max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE,
        frame_timeout: Union[float, None] = DEFAULT_FRAME_TIMEOUT,
        describe_loss: Union[Callable[[str], Awaitable[LossInfo]], None] = None,
        redact: Callable[[str], str] = _identity,
        ids: Union[Iterator[int], None] = None,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        token: Union[str, bytes, None] = None,
    ) -> None:
        self._receive_stream = receive_stream
        # As the sidecar reads its --token-file: surrounding whitespace (a trailing newline) is not part of it.
        self._token = token.strip() if token is not None else None
        self._max_buffered = max_buffered
        self._send_stream = send_stream
        self._sender = FrameSender(send_stream, frame_timeout)
        #: Set when a request ends (a place in the sidecar's queue may be free), if anyone waits.
        self._room = anyio.Event()
        self._room_wanted = False
        self._reader = FrameReader(receive_stream, max_frame_size=max_frame_size, frame_timeout=frame_timeout)
        self._ready_timeout = ready_timeout
        self._describe_loss = describe_loss
        self._redact = redact
        self._ids = ids if ids is not None else itertools.count(1)
        self._default_timeout = timeout
        self._default_idle_timeout = idle_timeout
        self._pending: dict[int, Exchange] = {}
        #: The event loop's clock, callable from the reader's callback (set by :meth:`run`).
        self.clock: Callable[[], float] = anyio.current_time
        #: What the reader's callback leaves for the reader task (it may start no task itself).
        self._deferred: list[Callable[[], None]] = []
        self._routing = False
        self._alarm = DeadlineAlarm()
        #: Makes events; :meth:`run` swaps in the running backend's own class (no backend lookup per event).
        self._new_event: Callable[[], anyio.Event] = anyio.Event
        self._new_wakeup: Callable[[], Wakeup] = anyio.Event  # what a request sleeps on; run() picks the backend's
        self._tg: Union[TaskGroup, None] = None
        self._read_scope = anyio.CancelScope()
        self._abort_reason = "the connection was aborted"
        self._fatal: Union[protocol.Error, None] = None
        self._error: Union[SidecarError, None] = None
        #: Whether the end of the stream is expected (:meth:`mark_closing`): it then ends in ClosedError.
        self._end_expected = False
        #: Whether this side asked the sidecar to stop (``shutdown``, :meth:`aclose`).
        self._asked_to_stop = False
        #: Set when the sidecar announced it stopped reading (an ``error`` without id,
        #: code ``shutting_down``): no request may be sent on this connection any more.
        self._announced_end: Union[ClosedError, None] = None
        self._started = False
        self._ready_event = anyio.Event()
        self._reader_done = anyio.Event()
        self._closed_event = anyio.Event()
        self._run_done = anyio.Event()
        self._stack: Union[AsyncExitStack, None] = None
        #: The ``ready`` frame, once received.
        self.ready: Union[protocol.Ready, None] = None
        #: anyio clock time of the last progress or audio frame of any request.
        self.last_activity = -math.inf
        #: anyio clock time at which the connection failed or closed.
        self.closed_at: Union[float, None] = None

    # ---------------------------------------------------------------- state

    @property
    def info(self) -> SidecarInfo:
        """The facts of the ``ready`` frame."""
        if self.ready is None:
            raise RuntimeError("the connection has not received 'ready' yet")
        return SidecarInfo.from_ready(self.ready)

    @property
    def closed(self) -> bool:
        """Whether the connection has ended (failed or closed); see :attr:`error`."""
        return self._error is not None

    @property
    def accepting(self) -> bool:
        """Whether requests may be sent: open, and the sidecar has not announced its end."""
        return self._error is None and self._announced_end is None

    @property
    def ending(self) -> Union[ClosedError, None]:
        """Why the sidecar stopped reading, when it announced it before its stream ended."""
        return self._announced_end

    @property
    def error(self) -> Union[SidecarError, None]:
        """The error that ended the connection, or None while it is open."""
        return self._error

    @property
    def pending(self) -> int:
        """Request ids still waiting for their terminal frame (abandoned ones included)."""
        return len(self._pending)

    @property
    def asked_to_stop(self) -> bool:
        """Whether this side asked the sidecar to stop (``shutdown``, :meth:`aclose`)."""
        return self._asked_to_stop

    @property
    def ready_event(self) -> anyio.Event:
        """Set when ``ready`` has been received."""
        return self._ready_event

    @property
    def closed_event(self) -> anyio.Event:
        """Set when the connection has ended (see :attr:`error`)."""
        return self._closed_event

    @property
    def reader_done(self) -> anyio.Event:
        """Set when the reader has stopped: nothing more will be read from the stream."""
        return self._reader_done

    async def heartbeat(self, timeout: float) -> None:  # noqa: ASYNC109
        """One ``ping`` that must be answered within ``timeout``; never cancelled on the wire."""
        await self._call(lambda i: protocol.Ping(id=i), timeout=timeout, idle_timeout=None, cancellable=False)

    async def wait_ready(self) -> protocol.Ready:
        """Wait for ``ready``; raise the connection's error (a StartError) if it ends first."""
        while self.ready is None:
            if self._error is not None:
                raise fresh(self._error)
            async with anyio.create_task_group() as tg:

                async def watch(event: anyio.Event) -> None:
                    await event.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(watch, self._ready_event)
                tg.start_soon(watch, self._closed_event)
        return self.ready

    async def wait_closed(self) -> SidecarError:
        """Wait until the connection ends; return the error that ended it."""
        await self._closed_event.wait()
        assert self._error is not None
        return self._error

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Connection:
        if self._started:
            raise RuntimeError("a Connection can be entered once")
        stack = AsyncExitStack()
        try:
            tg = await stack.enter_async_context(anyio.create_task_group())
            tg.start_soon(self.run)
            with anyio.move_on_after(math.inf if self._ready_timeout is None else self._ready_timeout):
                await self.wait_ready()
            if self.ready is None:
                raise StartError(f"no 'ready' frame within {self._ready_timeout:g} s")
        except BaseException:
            await self.aclose()
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> None:
        stack, self._stack = self._stack, None
        await self.aclose()  # shielded; the reader task ends with it
        if stack is not None:
            await stack.aclose()

    async def aclose(self) -> None:
        """Close both streams; pending requests fail with :class:`ClosedError`.  Idempotent."""
        self._end_expected = True
        self._asked_to_stop = True
        self.abort("the connection was closed")
        with anyio.CancelScope(shield=True):
            await self.close_send()
            try:
                await self._receive_stream.aclose()
            except Exception:  # closing a broken stream
                pass
            if self._started:
                await self._run_done.wait()
            elif self._error is None:
                self._break(ClosedError("the connection was closed"))

    async def close_send(self) -> None:
        """Close the sending stream (the sidecar sees end of input and exits)."""
        with anyio.CancelScope(shield=True):
            try:
                await self._send_stream.aclose()
            except Exception:  # closing a broken stream
                pass

    def abort(self, reason: str) -> None:
        """Stop reading now; pending requests fail (described by ``describe_loss``)."""
        if not self._reader_done.is_set():
            self._abort_reason = reason
        self._read_scope.cancel()

    def mark_closing(self) -> None:
        """From now on the end of the stream is expected: pending requests fail with ClosedError."""
        self._end_expected = True

    async def run(self) -> None:
        """Read and route frames until the stream ends, then fail what is pending.

        Runs the reader and hosts the background cancels; returns (never raises, except
        for cancellation) once the connection has ended.
        """
        if self._started:
            raise RuntimeError("Connection.run() can be called once")
        self._started = True
        self._new_event = self._alarm.new_event = type(anyio.Event())
        self._new_wakeup = wakeup_class()
        self.clock = self._sender.clock = loop_clock()
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._alarm.run)
                loss = await self._read_loop()
                self._reader_done.set()
                error = await self._error_for(loss)
                self._break(error)
                tg.cancel_scope.cancel()
        finally:
            self._tg = None
            self._reader_done.set()
            if self._error is None:
                self._break(ClosedError("the connection's reader was stopped"))
            self._run_done.set()

    def _break(self, error: SidecarError) -> None:
        if self._error is not None:
            return
        self._error = error
        self.closed_at = anyio.current_time()
        pending = list(self._pending.values())
        self._pending.clear()
        for exchange in pending:
            exchange.fail(fresh(error))
        self._read_scope.cancel()
        self._closed_event.set()
        if isinstance(error, ClosedError):
            log.debug("connection closed: %s", error)
        else:
            log.warning("connection to the sidecar lost: %s", error.message)

    # --------------------------------------------------------------- reading

    async def _read_loop(self) -> Loss:
        with self._read_scope:
            try:
                first = await handshake(
                    self._reader, token=self._token, send_raw=self._sender.send_raw, redact=self._redact
                )
                if isinstance(first, Loss):
                    return first
                self._on_ready(first)
                losses: list[Loss] = []

                def on_frame(body: memoryview) -> bool:
                    self._routing = True
                    try:
                        loss = self._handle(body)
                    finally:
                        self._routing = False
                    if loss is not None:
                        losses.append(loss)
                    return bool(losses or self._deferred)

                # Then every frame is routed as it arrives (see FrameReader.pump).
                while await self._reader.pump(on_frame):
                    if losses:
                        return losses[0]
                    deferred, self._deferred = self._deferred, []
                    for action in deferred:
                        action()
                return Loss("eof", "the sidecar's output stream ended")
            except TruncatedFrame as exc:
                if not exc.ended:  # stalled inside a frame: the sidecar is wedged mid-write
                    return Loss("framing", f"framing lost on the sidecar's output: {exc}")
                # The stream ended inside a frame: the sidecar died (or its socket dropped)
                # mid-write.  That is the end of its output, not a breach of the protocol, so
                # it fails pending requests as a crash does, which Pool retries elsewhere.
                return Loss("eof", f"the sidecar's output stream ended inside a frame ({exc})")
            except FramingError as exc:
                return Loss("framing", f"framing lost on the sidecar's output: {exc}")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                return Loss("eof", "the sidecar's output stream ended")
            except Exception as exc:  # a bug here must still fail the pending requests
                log.exception("internal error in the frame reader")
                return Loss("protocol", f"internal error in the frame reader: {exc!r}")
        return Loss("aborted", self._abort_reason)

    def _handle(self, body: memoryview) -> Union[Loss, None]:
        """Route one frame read after ``ready`` to its exchange."""
        try:
            reply = protocol.decode_reply(body)
        except msgspec.MsgspecError as exc:
            return Loss("protocol", f"the sidecar sent an undecodable frame ({exc}): {bytes(body[:48])!r}")
        if type(reply) is protocol.Audio and reply.shm_offset is not None:  # (type(): exact classes, decoded)
            return Loss("protocol", "the sidecar sent audio in shared memory, which this client never offers")
        if isinstance(reply, protocol.Ready):
            return Loss("protocol", "the sidecar sent a second 'ready' frame")
        request_id = reply.id
        if request_id is None:
            assert isinstance(reply, protocol.Error)
            self._connection_error(reply)
            return None
        exchange = self._pending.get(request_id)
        if exchange is None:
            log.debug("dropping a %s frame for unknown request id %d", type(reply).__name__, request_id)
            return None
        now = self.clock()
        terminal = type(reply) in TERMINAL_KINDS  # (an error without an id was handled above)
        if terminal:
            del self._pending[request_id]
            if self._room_wanted:  # a request that was refused busy waits for this
                self._room_wanted = False
                self._room.set()
                self._room = self._new_event()
            if exchange.state is ABANDONED:
                log.debug("abandoned request %d ended with %s", request_id, _describe_reply(reply))
        else:
            self.last_activity = now
        exchange.receive(reply, now, terminal, self._reader.shares)
        if exchange.buffered > self._max_buffered:
            self._overflow(exchange)
        return None

    def _overflow(self, exchange: Exchange) -> None:
        """A consumer fell too far behind: cancel its request, fail it; nobody else waits."""
        error = BufferFullError(
            f"request {exchange.id}: {exchange.buffered} bytes of audio arrived that its consumer did not take, "
            f"more than max_buffered ({self._max_buffered}); the request was cancelled",
            request_id=exchange.id,
            limit=self._max_buffered,
        )
        log.warning("%s", error.message)
        self.abandon(exchange, cancel=True)  # its later frames are dropped
        exchange.fail(error)

    def _on_ready(self, ready: protocol.Ready) -> None:
        self.ready = ready
        self._reader.max_frame_size = max(ready.max_frame_size, protocol.MIN_MAX_FRAME_SIZE)
        self._ready_event.set()
        log.debug("sidecar ready: %s", ready)

    def _connection_error(self, error: protocol.Error) -> None:
        message = self._redact(error.message)
        if error.code == "shutting_down":
            # The sidecar stopped reading (SIGTERM, end of input) and has already sent
            # the terminal frame of every request it read: those still pending never
            # reached it, and a supervisor may send them to a new sidecar.
            log.info("the sidecar is stopping on its own: %s", message)
            self._announced_end = ClosedError(f"the sidecar stopped on its own: {message}")
            for exchange in list(self._pending.values()):
                del self._pending[exchange.id]
                exchange.fail(UnreadError(f"the sidecar stopped before reading request {exchange.id}"))
            return
        if error.detail.get("fatal") or error.code in ("frame_too_large", "truncated_frame"):
            self._fatal = error
            log.error("the sidecar lost framing: %s: %s", error.code, message)
        else:
            log.warning("the sidecar reported a connection error: %s: %s", error.code, message)

    async def _error_for(self, loss: Loss) -> SidecarError:
        info = LossInfo()
        if self._describe_loss is not None:
            try:
                info = await self._describe_loss(loss.kind)
            except Exception:  # a broken describer must not lose the error
                log.exception("describing the end of the connection failed")
        if self._end_expected and self.ready is not None and loss.kind in ("eof", "aborted"):
            return ClosedError("the connection was closed")
        fatal = None
        if self._fatal is not None:
            fatal = f"{self._fatal.code}: {self._redact(self._fatal.message)}"
        return error_for_loss(loss, info, handshaken=self.ready is not None, fatal=fatal)

    def _check_open(self) -> None:
        if self._error is not None:
            raise fresh(self._error)
        if self.ready is None:
            raise RuntimeError("the connection has not received 'ready' yet")
        if self._announced_end is not None:
            raise UnreadError(self._announced_end.message)

    # ------------------------------------------------ the request seam (Channel)

    def redact(self, text: str) -> str:
        """``text`` with the secrets this connection knows of blanked out."""
        return self._redact(text)

    def open_exchange(self, build: _Build) -> Exchange:
        """Give the request built by ``build(id)`` an id and its frame; nothing is sent yet.

        Raises the connection's error once it ended, and :class:`InvalidRequestError` for a
        request no sidecar would take (see :func:`~._exchange.encode_request`).
        """
        self._check_open()
        assert self.ready is not None
        request_id = next(self._ids)
        data = encode_request(build(request_id), self.ready.max_frame_size)
        exchange = Exchange(request_id, self.clock(), self._new_wakeup)
        exchange.data = data
        self._pending[request_id] = exchange
        return exchange

    async def send(self, exchange: Exchange) -> None:
        """Write an opened exchange's frame.  Once its first byte is written the send is shielded."""
        data, exchange.data = exchange.data, b""
        failure = await self._sender.send(data, exchange, self._check_sendable)
        if failure is None:
            return
        # The reader usually sees the end of the stream at the same time; give it a
        # moment to read what the sidecar wrote before it went away.
        with anyio.move_on_after(1.0):
            await self._closed_event.wait()
        self.abort(failure)
        await self._closed_event.wait()
        assert self._error is not None
        raise fresh(self._error)

    def wait(self, exchange: Exchange, deadline: float) -> Awaitable[None]:
        """Until a frame or a failure arrives for ``exchange``, or ``deadline`` passes; returns either way.

        The connection's one alarm enforces the deadlines of all waiting requests, so a wait
        costs no cancel scope and no timer of its own; the caller looks at the clock.
        """
        return self._alarm.wait(exchange, deadline)

    def room(self) -> Union[anyio.Event, None]:
        """An event set when the next request of this connection ends; None when none is in flight."""
        if not self._pending:
            return None
        self._room_wanted = True
        return self._room

    def abandon(self, exchange: Exchange, *, cancel: bool) -> Union[anyio.Event, None]:
        """The request's caller gave up on it; its frames are dropped from now on.

        With ``cancel`` a request on the wire is cancelled on the sidecar in the background;
        returns an event set once that ``cancel`` frame is written (None when none is sent).
        Without (ping), the sidecar finishes it and its answer is dropped.  Never blocks
        and never raises: callable from a cancelled task and from the reader.
        """
        if exchange.state is ABANDONED:
            return exchange.cancel_sent
        was = exchange.abandon()
        if was is REGISTERED:  # never written: the sidecar knows nothing of it
            self._pending.pop(exchange.id, None)
            return None
        ended = was is ENDED or self._pending.get(exchange.id) is not exchange
        tg = self._tg
        if not cancel or ended or tg is None or self._error is not None:
            return None
        exchange.cancel_sent = self._new_event()
        if self._routing:
            # Called from the reader's callback, which may start no task: right after it.
            def start() -> None:
                tg.start_soon(self._cancel_in_background, exchange)

            self._deferred.append(start)
        else:
            tg.start_soon(self._cancel_in_background, exchange)
        return exchange.cancel_sent

    # --------------------------------------------------------------- writing

    def _check_sendable(self, exchange: Union[Exchange, None]) -> None:
        """Raise the connection's error, or its announced end, if nothing may be sent any more."""
        if self._error is not None:
            raise fresh(self._error)
        if self._announced_end is not None:
            if exchange is not None:
                self._pending.pop(exchange.id, None)
            raise UnreadError(self._announced_end.message)

    async def _cancel_in_background(self, target: Exchange) -> None:
        try:
            if self._pending.get(target.id) is not target or self._error is not None:
                return  # it ended meanwhile: nothing to cancel
            cancel = Exchange(next(self._ids), anyio.current_time(), self._new_wakeup)
            self._pending[cancel.id] = cancel
            try:
                cancel.data = protocol.frame(protocol.Cancel(id=cancel.id, target=target.id))
                await self.send(cancel)
            finally:
                # Its ``ok`` is collected by the reader and dropped; one never written never comes.
                if cancel.abandon() is REGISTERED:
                    self._pending.pop(cancel.id, None)
            log.debug("cancel %d sent for request %d", cancel.id, target.id)
        except SidecarError as exc:
            log.debug("could not cancel request %d: %s", target.id, exc)
        except Exception:
            log.exception("internal error cancelling request %d", target.id)
        finally:
            if target.cancel_sent is not None:
                target.cancel_sent.set()

    async def _connection(self) -> Connection:
        if self._announced_end is not None and self._error is None:
            raise fresh(self._announced_end)  # nothing can restart this sidecar
        self._check_open()
        return self

    async def shutdown(self, *, timeout: Union[float, None] = None) -> None:  # noqa: ASYNC109
        """Ask the sidecar to stop (``shutdown``): pending requests end with ``shutting_down``.

        Returns when the sidecar acknowledged it; the stream ends right after.
        """
        self.mark_closing()
        self._asked_to_stop = True
        await self._call(lambda i: protocol.Shutdown(id=i), timeout=timeout, idle_timeout=None, cancellable=False)


def _describe_reply(reply: protocol.Reply) -> str:
    if isinstance(reply, protocol.Error):
        return f"error {reply.code}"
    return type(reply).__name__.lower()
