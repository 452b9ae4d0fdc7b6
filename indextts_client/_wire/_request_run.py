"""A request's run, as its caller sees it: deadlines, progress callbacks, audio, resends, cancel on abandon.

Everything here runs in the task that awaits the request, never in the frame reader:
a slow or failing callback stalls and fails only its own request.  A request that is
abandoned for any reason (its task is cancelled, a deadline fires, a callback raises,
a stream is left early) is cancelled on the sidecar by the connection, in the
background.  A run talks to its connection only through :class:`~._exchange.Channel`.
"""

from __future__ import annotations

import enum
import inspect
import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Union

import anyio
import msgspec

from indextts_sidecar import protocol

from .._audio import Audio, AudioAssembler, AudioChunk, WordTiming, built
from .._exceptions import (
    ClosedError,
    Deadline,
    ProtocolError,
    RequestTimeoutError,
    SidecarError,
    UnreadError,
    error_for_frame,
)
from .._types import ProgressCallback, ProgressEvent
from ._exchange import REGISTERED, Channel, Exchange

__all__ = ["Call", "Synthesis"]

_Opener = Callable[[], Awaitable[Channel]]
_Build = Callable[[int], protocol.Request]
#: How often one request is sent again after a sidecar stopped without reading it.
_MAX_RESENDS = 3
#: The longest pause between tries of a request refused busy while no other request of its
#: connection is in flight (the pauses double from 1 ms).
_BUSY_PAUSE_MAX = 0.1


class _Phase(enum.Enum):
    """Where a run is for its caller; its request ids' life on the wire is each Exchange's state."""

    NEW = "new"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CLOSED = "closed"


NEW, RUNNING, DONE, FAILED, CLOSED = _Phase.NEW, _Phase.RUNNING, _Phase.DONE, _Phase.FAILED, _Phase.CLOSED


class _RequestRun:
    """One request from its caller's side: start, next frame under deadlines, resend, give up.

    A run may send its request more than once (a sidecar stopped before reading it, or
    refused it busy): each send is a new :class:`Exchange`, the current one in ``_ex``.
    """

    def __init__(
        self,
        opener: _Opener,
        build: _Build,
        *,
        timeout: Union[float, None],
        idle_timeout: Union[float, None],
        on_progress: Union[ProgressCallback, None],
        cancellable: bool = True,
        pool_timeout: Union[float, None] = None,
    ) -> None:
        self._opener = opener
        #: How long a request the sidecar refuses ``busy`` waits for room and is sent again.
        self._pool_timeout = pool_timeout
        self._busy_until: Union[float, None] = None
        #: The pause before sending it again when refused busy with nothing else in flight.
        self._busy_pause = 0.0
        self._build = build
        self._timeout = timeout
        self._idle = idle_timeout
        self._on_progress = on_progress
        self._cancellable = cancellable
        self._conn: Union[Channel, None] = None
        self._ex: Union[Exchange, None] = None
        self._deadline: Union[float, None] = None
        self._phase = NEW
        #: Why the run failed (FAILED), raised again at each later step.
        self._failure: Union[Exception, None] = None
        self._resends = 0
        #: Frames of this request handed to the caller so far.
        self._received = 0

    @property
    def request_id(self) -> Union[int, None]:
        """The id on the wire, once the request is sent."""
        return None if self._ex is None else self._ex.id

    async def _begin(self) -> None:
        self._phase = RUNNING
        if self._timeout is None:
            await self._open_and_send()  # what _send() does without a deadline, one call less
            return
        self._deadline = anyio.current_time() + self._timeout
        await self._send()

    async def _send(self) -> None:
        """Open a connection (restarting the sidecar if needed), register and send the request."""
        if self._deadline is None:
            await self._open_and_send()
            return
        with anyio.move_on_at(self._deadline) as scope:
            await self._open_and_send()
        if (self._ex is None or self._ex.state is REGISTERED) and scope.cancelled_caught:
            self._fire("timeout")

    async def _open_and_send(self) -> None:
        while True:
            conn = self._conn = await self._opener()
            ex = self._ex = conn.open_exchange(self._build_for(conn))
            self._prepare(ex)
            try:
                await conn.send(ex)
            except SidecarError as exc:
                # The sidecar announced its end meanwhile (it read no request after those it
                # ended: this one is unread), and the write may then fail on the closed pipe
                # (CrashedError, exit code 0): the next opener call starts another sidecar.
                unread = isinstance(exc, UnreadError) or isinstance(ex.error, UnreadError)
                if not unread or self._resends >= _MAX_RESENDS:
                    raise
                self._resends += 1
                continue
            return

    def _build_for(self, conn: Channel) -> _Build:
        """What builds the request sent on ``conn``."""
        return self._build

    def _prepare(self, exchange: Exchange) -> None:
        """The request has its id and is about to be sent: say what the reader does with its frames."""
        exchange.progress_wanted = self._on_progress is not None

    async def _advance(self) -> Any:
        """Consume one frame; return an event, or None once the request has finished."""
        raise NotImplementedError

    async def _step(self) -> Any:
        phase = self._phase
        if phase is DONE:
            return None
        if phase is FAILED:
            assert self._failure is not None
            raise self._failure
        if phase is CLOSED:
            raise ClosedError("the request was closed before it finished")
        try:
            if phase is NEW:
                await self._begin()
            return await self._advance()
        except BaseException as exc:
            self._end_early(exc)
            raise

    def _end_early(self, exc: BaseException) -> None:
        """``exc`` ends the run before its end: give the request up, remember why."""
        if self._phase is DONE:
            return
        self._give_up()
        if isinstance(exc, Exception):
            self._phase, self._failure = FAILED, exc
        else:
            self._phase = CLOSED

    def _give_up(self) -> None:
        conn, ex = self._conn, self._ex
        if conn is not None and ex is not None:
            conn.abandon(ex, cancel=self._cancellable)

    async def _next_reply(self) -> protocol.Reply:
        ex, conn = self._ex, self._conn
        assert ex is not None and conn is not None
        while True:
            item = ex.next_item()
            if item is not None and type(item) is not protocol.Error:
                self._received += 1
                return item
            if item is None and ex.error is None:
                due_at, deadline = self._next_deadline(ex, conn)
                if due_at == math.inf:
                    await ex.wait()
                    continue
                if conn.clock() >= due_at:
                    self._fire(deadline)
                await conn.wait(ex, due_at)
                continue
            if await self._goes_again(item, ex, conn):
                await self._send()
                ex, conn = self._ex, self._conn
                assert ex is not None and conn is not None
                continue
            if item is None:
                assert ex.error is not None
                raise ex.error
            self._received += 1
            return item

    async def _goes_again(self, item: Union[protocol.Reply, None], ex: Exchange, conn: Channel) -> bool:
        """Whether the request is sent again instead of ending with ``item`` (None: with ``ex.error``).

        It goes again when the sidecar never read it, stopped on its own before it produced
        anything (SIGTERM, its parent watch; nobody here asked it to stop: a new sidecar
        serves it), or refused it busy and a place came free within ``pool_timeout``.
        """
        if item is None:
            reason = "unread" if isinstance(ex.error, UnreadError) else None
        elif isinstance(item, protocol.Error) and not self._received and not ex.taken_by_reader:
            reason = item.code
        else:
            return False
        if reason == "busy":
            return self._pool_timeout is not None and await self._room_within_pool_timeout(conn)
        stopped_on_its_own = reason == "unread" or (reason == "shutting_down" and not conn.asked_to_stop)
        if stopped_on_its_own and self._resends < _MAX_RESENDS:
            self._resends += 1
            return True
        return False

    async def _room_within_pool_timeout(self, conn: Channel) -> bool:
        """Wait for room in the sidecar's queue, within ``pool_timeout`` of the first refusal.

        Room comes when another request of ``conn`` ends.  With none left in flight no end
        is coming: the queue emptied before this request read its refusal (it tries again at
        once), or it is full of other clients' requests (a shared socket sidecar: it tries
        again after pauses that grow to ``_BUSY_PAUSE_MAX``).
        """
        assert self._pool_timeout is not None
        now = anyio.current_time()
        if self._busy_until is None:
            self._busy_until = now + self._pool_timeout
        limit = self._busy_until if self._deadline is None else min(self._busy_until, self._deadline)
        room = conn.room()
        with anyio.move_on_at(limit):
            if room is not None:
                await room.wait()
            else:
                await anyio.sleep(self._busy_pause)
                self._busy_pause = min(2 * self._busy_pause + 0.001, _BUSY_PAUSE_MAX)
            return True
        return False

    def _next_deadline(self, ex: Exchange, conn: Channel) -> tuple[float, Deadline]:
        """When the request must wake at the latest, and which of its deadlines that is."""
        best, deadline = math.inf, "timeout"
        if self._deadline is not None:
            best = self._deadline
        if self._idle is not None:
            # Idle time counts from this request's last frame; while it waits in the
            # sidecar's queue, frames of the requests ahead of it count as progress too.
            base = ex.last_frame if ex.last_frame is not None else max(ex.sent_at, conn.last_activity)
            if base + self._idle < best:
                best, deadline = base + self._idle, "idle_timeout"
        return best, deadline  # type: ignore[return-value]

    def _fire(self, deadline: Deadline) -> None:
        rid = self.request_id
        name = "request" if rid is None else f"request {rid}"
        if deadline == "timeout":
            seconds = self._timeout or 0.0
            message = f"{name} did not finish within {seconds:g} s (timeout)"
        else:
            seconds = self._idle or 0.0
            message = f"{name}: no progress or audio from the sidecar for {seconds:g} s (idle_timeout)"
        raise RequestTimeoutError(message, deadline=deadline, seconds=seconds, request_id=rid)

    async def _notify(self, event: ProgressEvent) -> None:
        callback = self._on_progress
        if callback is None:
            return
        with anyio.move_on_at(math.inf if self._deadline is None else self._deadline) as scope:
            result = callback(event)
            if inspect.isawaitable(result):
                await result
        if scope.cancelled_caught:
            self._fire("timeout")

    def _frame_error(self, reply: protocol.Error) -> Exception:
        assert self._conn is not None
        self._phase = FAILED
        redact = self._conn.redact
        self._failure = error_for_frame(
            reply.code,
            redact(reply.message),
            request_id=reply.id,
            retryable=reply.retryable,
            # detail["traceback"] quotes the engine's locals and arguments: secrets too.
            detail={key: redact(value) if isinstance(value, str) else value for key, value in reply.detail.items()},
        )
        return self._failure

    async def _close(self, *, wait: bool) -> None:
        if self._phase is NEW:
            self._phase = CLOSED
            return
        if self._phase is RUNNING:
            self._give_up()
            self._phase = CLOSED
        if wait:
            await self._cancel_written()

    async def _cancel_written(self) -> None:
        """Wait (briefly) until the background ``cancel`` of this request is on the wire.

        Then a request sent next by the same task cannot overtake it.
        """
        sent = None if self._ex is None else self._ex.cancel_sent
        if sent is not None:
            with anyio.move_on_after(5.0):
                await sent.wait()


class Call(_RequestRun):
    """A request answered by one terminal frame (``ok``/``pong``), maybe after progress."""

    #: The terminal frame, once it arrived.
    reply: Union[protocol.Ok, protocol.Pong, None] = None

    @property
    def round_trip(self) -> float:
        """Seconds from the write of the request to the arrival of its answer."""
        ex = self._ex
        assert ex is not None and ex.last_frame is not None
        return max(0.0, ex.last_frame - ex.sent_at)

    async def _advance(self) -> Union[ProgressEvent, None]:
        reply = await self._next_reply()
        if isinstance(reply, protocol.Progress):
            event = ProgressEvent(reply.stage, reply.fraction, reply.message, reply.id)
            await self._notify(event)
            return event
        if isinstance(reply, (protocol.Ok, protocol.Pong)):
            self.reply = reply
            self._phase = DONE
            return None
        if isinstance(reply, protocol.Error):
            raise self._frame_error(reply)
        raise ProtocolError(f"unexpected {type(reply).__name__} frame for request {self.request_id}")

    async def run(self) -> Union[protocol.Ok, protocol.Pong]:
        try:
            while await self._step() is not None:
                pass
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:
            await self._cancel_written()
            raise
        assert self.reply is not None
        return self.reply


class Synthesis(_RequestRun):
    """One ``synthesize`` request: its audio chunks, progress events and result.

    Returned by :meth:`Client.request` (keeps the audio for :meth:`result`) and
    :meth:`Client.stream` (keeps nothing).  The request is sent on ``async with`` entry
    or at the first iteration.

    * ``async for chunk in synthesis`` yields :class:`AudioChunk` as frames arrive;
    * ``async for event in synthesis.events()`` yields :class:`ProgressEvent` and
      :class:`AudioChunk` in arrival order;
    * ``await synthesis.result()`` waits for the end and returns the :class:`Audio`.

    Leaving ``async with`` before the end cancels the request on the sidecar at once.
    Iterating without ``async with`` (or an explicit :meth:`start`, which makes the
    caller responsible for :meth:`aclose`) raises ``RuntimeError``: after a ``break``
    nothing would cancel the request, which would occupy the engine to its end.
    """

    #: A client's request is served by no pool member (a :class:`ServedStream`'s attribute).
    member_index: Union[int, None] = None

    def __init__(
        self,
        opener: _Opener,
        build: _Build,
        *,
        keep_audio: bool,
        timeout: Union[float, None],
        idle_timeout: Union[float, None],
        on_progress: Union[ProgressCallback, None],
        pool_timeout: Union[float, None] = None,
        assemble_in_reader: bool = False,
        text: str = "",
        quiet: bool = False,
    ) -> None:
        super().__init__(
            opener,
            build,
            timeout=timeout,
            idle_timeout=idle_timeout,
            on_progress=on_progress,
            pool_timeout=pool_timeout,
        )
        self._keep = keep_audio
        self._assembler: Union[AudioAssembler, None] = None
        #: The request's text, which an engine's word and segment spans point into.
        self._text = text
        #: ``build`` asks the sidecar for no progress (synthesize()'s fast path): then it announces
        #: no segments either, so a request to an engine without word timings asks for it again.
        self._quiet = quiet
        #: Whether the engine reports words (else segments stand in for them).
        self._word_timings = False
        #: synthesize()'s, which never hands out chunks: the connection's reader assembles
        #: the audio as frames arrive (see Exchange.assemble_audio).
        self._assemble_in_reader = assemble_in_reader
        self._audio: Union[Audio, None] = None
        #: The sidecar's seconds per phase, from ``done`` (empty until then).
        self.timings: dict[str, float] = {}
        #: The engine's facts about the request, from ``done`` (``voice_cache``...).
        self.facts: dict[str, Any] = {}
        #: Every word of the request (see :attr:`Audio.words`), from ``done`` (empty until then).
        self.words: tuple[WordTiming, ...] = ()
        #: Whether ``async with`` or an explicit start() made someone responsible for closing it.
        self._owned = False

    @property
    def finished(self) -> bool:
        """Whether the request ended (successfully, with an error, or closed)."""
        return self._phase in (DONE, FAILED, CLOSED)

    async def _advance(self) -> Union[ProgressEvent, AudioChunk, None]:
        reply = await self._next_reply()
        assembler = self._assembler
        if assembler is None:
            assert self._ex is not None
            assembler = self._assembler = AudioAssembler(self._ex.id, keep=self._keep, text=self._text)
        # (type() is: the decoder makes these exact classes)
        if type(reply) is protocol.Audio:
            return assembler.add(reply.seq, reply.sample_rate, reply.pcm, reply.words)
        if type(reply) is protocol.Done:
            self._phase = DONE
            assembler.check_done(reply.samples, reply.chunks, reply.sample_rate)
            # The decoded frame's own dicts: nothing else holds them.
            self.timings = reply.timings
            self.facts = reply.facts
            self.words = assembler.all_words(reply.sample_rate, reply.words, by_segment=not self._word_timings)
            if self._keep:
                self._audio = built(
                    Audio,
                    samples=assembler.assemble(),
                    sample_rate=reply.sample_rate,
                    timings=self.timings,
                    request_id=reply.id,
                    facts=self.facts,
                    words=self.words,
                )
            return None
        if type(reply) is protocol.Progress:
            if not self._assemble_in_reader:  # (else the reader saw it in its place among the audio)
                assembler.progress(reply.stage, reply.message)  # it may name the text the audio after it speaks
            event = ProgressEvent(reply.stage, reply.fraction, reply.message, reply.id)
            await self._notify(event)
            return event
        if isinstance(reply, protocol.Error):
            raise self._frame_error(reply)
        raise ProtocolError(f"unexpected {type(reply).__name__} frame for synthesize request {self.request_id}")

    def _prepare(self, exchange: Exchange) -> None:
        # Without the reader's assembly the caller may iterate events(), progress included.
        exchange.progress_wanted = self._on_progress is not None or not self._assemble_in_reader
        if self._assemble_in_reader:
            self._assembler = exchange.assemble_audio(self._text)
        else:
            self._assembler = None  # a request sent again starts over

    def _build_for(self, conn: Channel) -> _Build:
        ready = conn.ready
        self._word_timings = ready is not None and "word_timings" in ready.capabilities
        if not self._quiet or self._word_timings:
            return self._build
        build = self._build

        def with_progress(request_id: int) -> protocol.Request:
            # The segments stand in for the words this engine does not report.
            return msgspec.structs.replace(build(request_id), progress=True)

        return with_progress

    async def start(self) -> None:
        """Send the request now (``async with`` does it for you); then :meth:`aclose` is yours to call."""
        self._owned = True
        if self._phase is NEW:
            try:
                await self._begin()
            except BaseException as exc:
                self._end_early(exc)
                raise

    async def __aenter__(self) -> Synthesis:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> None:
        cancelled = exc_type is not None and issubclass(exc_type, anyio.get_cancelled_exc_class())
        await self._close(wait=not cancelled)

    def __aiter__(self) -> Synthesis:
        self._check_owned()
        return self

    def _check_owned(self) -> None:
        if not self._owned:
            raise RuntimeError(
                "iterate inside 'async with client.stream(...) as chunks:' (or request()), so that leaving "
                "the loop early cancels the request; or call 'await synthesis.start()' and close it yourself "
                "with 'await synthesis.aclose()'"
            )

    async def __anext__(self) -> AudioChunk:
        while True:
            item = await self._step()
            if item is None:
                raise StopAsyncIteration
            if isinstance(item, AudioChunk):
                return item

    def events(self) -> _Events:
        """An async iterator over progress events and audio chunks, in arrival order."""
        self._check_owned()
        return _Events(self)

    async def result(self) -> Audio:
        """Wait for the end of the request and return its audio (the chunks not yet consumed included)."""
        if not self._keep:
            raise RuntimeError("a stream() keeps no audio; use request() or synthesize() for a whole result")
        while await self._step() is not None:
            pass
        assert self._audio is not None
        return self._audio

    async def whole(self) -> Audio:
        """``async with self: return await self.result()``, in one coroutine (``synthesize()``).

        For a new run (synthesize()'s) what :meth:`start` and :meth:`_step` do, inlined: it runs
        until :meth:`_advance` says it is done or raises (then it ends early, as in ``_step``).
        """
        self._owned = True
        try:
            if self._phase is not NEW:
                while await self._step() is not None:
                    pass
            else:
                try:
                    await self._begin()
                    while await self._advance() is not None:
                        pass
                except BaseException as exc:
                    self._end_early(exc)
                    raise
        except BaseException as exc:
            await self._close(wait=not isinstance(exc, anyio.get_cancelled_exc_class()))
            raise
        # Done: closing it only waits for a cancel on its way, which a finished request has not.
        if self._ex is not None and self._ex.cancel_sent is not None:
            await self._close(wait=True)
        assert self._audio is not None
        return self._audio

    async def aclose(self) -> None:
        """Cancel the request if it has not finished (the cancel is written before this returns)."""
        await self._close(wait=True)


class _Events:
    def __init__(self, synthesis: Synthesis) -> None:
        self._synthesis = synthesis

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Union[ProgressEvent, AudioChunk]:
        item = await self._synthesis._step()
        if item is None:
            raise StopAsyncIteration
        assert isinstance(item, (ProgressEvent, AudioChunk))
        return item
