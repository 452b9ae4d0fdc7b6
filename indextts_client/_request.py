"""Requests as seen by their caller: deadlines, progress callbacks, audio, cancel on abandon.

Everything here runs in the task that awaits the request, never in the frame reader:
a slow or failing callback stalls and fails only its own request.  A request that is
abandoned for any reason (its task is cancelled, a deadline fires, a callback raises,
a stream is left early) is cancelled on the sidecar by the connection, in the
background.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Mapping
from types import EllipsisType, TracebackType
from typing import Any, Union

import anyio
import msgspec

from indextts_sidecar import protocol
from indextts_sidecar.protocol import Emotion, EmotionAudio, EmotionText, EmotionVector

from ._audio import Audio, AudioAssembler, AudioChunk
from ._exceptions import (
    ClosedError,
    Deadline,
    InvalidRequestError,
    ProtocolError,
    RequestTimeoutError,
    SidecarError,
    UnreadError,
    error_for_frame,
)
from ._exchange import Channel, Exchange
from ._types import Health, LoadInfo, ProgressCallback, ProgressEvent

__all__ = ["EmotionLike", "Requester", "Synthesis"]

#: What ``emotion=`` accepts: a protocol struct, or a dict of the eight named weights
#: (plus optional ``alpha``), or a dict with a ``kind`` of ``vector``/``audio``/``text``.
EmotionLike = Union[EmotionVector, EmotionAudio, EmotionText, Mapping[str, Any], None]
#: ``...`` means "the client's default"; None means "no limit".
TimeoutArg = Union[float, None, EllipsisType]

_Opener = Callable[[], Awaitable[Channel]]
#: How often one request is sent again after a sidecar stopped without reading it.
_MAX_RESENDS = 3
#: The shortest idle deadline for which synthesize() asks the sidecar for no progress: ten
#: times the most by which a quiet request's signs of life may trail its engine's progress.
_QUIET_IDLE_MIN = 10 * protocol.QUIET_PROGRESS_INTERVAL
#: The longest pause between tries of a request refused busy while no other request of its
#: connection is in flight (the pauses double from 1 ms).
_BUSY_PAUSE_MAX = 0.1
_Build = Callable[[int], protocol.Request]


def _resolve(value: TimeoutArg, default: Union[float, None]) -> Union[float, None]:
    if isinstance(value, EllipsisType):
        return default
    if value is not None and value < 0:
        raise ValueError(f"a timeout must be >= 0 or None, got {value!r}")
    return value


def _emotion(value: EmotionLike) -> Union[Emotion, None]:
    if value is None or isinstance(value, (EmotionVector, EmotionAudio, EmotionText)):
        return value
    if isinstance(value, Mapping):
        target: Any = Emotion if "kind" in value else EmotionVector
        try:
            result: Emotion = msgspec.convert(dict(value), target)
        except msgspec.ValidationError as exc:
            raise InvalidRequestError(
                f"emotion: {exc}", code="invalid_option", detail={"field": protocol.field_of(exc, "$.emotion")}
            ) from None
        return result
    raise TypeError(
        f"emotion must be an EmotionVector, EmotionAudio, EmotionText or a dict, not {type(value).__name__}"
    )


def _synthesize_builder(
    text: str,
    voice: Union[str, None],
    emotion: EmotionLike,
    sample_rate: Union[int, None],
    options: dict[str, Any],
    progress: bool = True,
) -> Callable[[int], protocol.Synthesize]:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    if voice is not None and not isinstance(voice, str):
        raise TypeError(f"voice must be a str or None, not {type(voice).__name__}")
    emo = _emotion(emotion)

    def build(request_id: int) -> protocol.Synthesize:
        return protocol.Synthesize(
            id=request_id,
            text=text,
            voice=voice,
            emotion=emo,
            sample_rate=sample_rate,
            options=options,
            progress=progress,
        )

    return build


class _Tracked:
    """One request from its caller's side: start, next frame under deadlines, give up."""

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
        #: new -> running -> done | failed | closed
        self._state = "new"
        self._failure: Union[Exception, None] = None
        self._cancel_sent: Union[anyio.Event, None] = None
        self._resends = 0
        #: Frames of this request handed to the caller so far.
        self._received = 0

    @property
    def request_id(self) -> Union[int, None]:
        """The id on the wire, once the request is sent."""
        return None if self._ex is None else self._ex.id

    async def _begin(self) -> None:
        self._state = "running"
        if self._timeout is not None:
            self._deadline = anyio.current_time() + self._timeout
        await self._send()

    async def _send(self) -> None:
        """Open a connection (restarting the sidecar if needed), register and send the request."""
        if self._deadline is None:
            await self._open_and_send()
            return
        with anyio.move_on_at(self._deadline) as scope:
            await self._open_and_send()
        if (self._ex is None or not self._ex.sent) and scope.cancelled_caught:
            self._fire("timeout")

    async def _open_and_send(self) -> None:
        while True:
            conn = self._conn = await self._opener()
            self._ex = conn._register(self._build)
            self._ex.progress_wanted = self._on_progress is not None or self._streams_events()
            self._registered(self._ex)
            try:
                await conn._send_exchange(self._ex)
            except SidecarError as exc:
                # The sidecar announced its end meanwhile (it read no request after those it
                # ended: this one is unread), and the write may then fail on the closed pipe
                # (CrashedError, exit code 0): the next opener call starts another sidecar.
                unread = isinstance(exc, UnreadError) or isinstance(self._ex.error, UnreadError)
                if not unread or self._resends >= _MAX_RESENDS:
                    raise
                self._resends += 1
                continue
            return

    async def _advance(self) -> Any:
        """Consume one frame; return an event, or None once the request has finished."""
        raise NotImplementedError

    def _streams_events(self) -> bool:
        """Whether the caller may see progress events without a callback (an iterator of events)."""
        return False

    def _registered(self, exchange: Exchange) -> None:
        """The request has its id, and is about to be sent."""

    async def _step(self) -> Any:
        if self._state == "done":
            return None
        if self._state == "failed":
            assert self._failure is not None
            raise self._failure
        if self._state == "closed":
            raise ClosedError("the request was closed before it finished")
        try:
            if self._state == "new":
                await self._begin()
            return await self._advance()
        except BaseException as exc:
            if self._state != "done":
                self._give_up()
                if isinstance(exc, Exception):
                    self._state, self._failure = "failed", exc
                else:
                    self._state = "closed"
            raise

    def _give_up(self) -> None:
        conn, ex = self._conn, self._ex
        if conn is None or ex is None:
            return
        if self._cancellable:
            self._cancel_sent = conn._forget(ex)
        else:
            conn._drop(ex)

    async def _next_reply(self) -> protocol.Reply:
        ex, conn = self._ex, self._conn
        assert ex is not None and conn is not None
        while True:
            if ex.items:
                item = ex.items.popleft()
                if isinstance(item, protocol.Audio):
                    ex.buffered -= len(item.pcm)
                if (
                    isinstance(item, protocol.Error)
                    and item.code == "shutting_down"
                    and not self._received
                    and not ex.absorbed
                    and not conn._stop_asked
                    and self._resends < _MAX_RESENDS
                ):
                    # The sidecar stopped on its own (SIGTERM, its parent watch) before this
                    # request produced anything, and nobody here asked it to: a new one serves it.
                    self._resends += 1
                    await self._send()
                    ex, conn = self._ex, self._conn
                    assert ex is not None and conn is not None
                    continue
                if (
                    isinstance(item, protocol.Error)
                    and item.code == "busy"
                    and not self._received
                    and not ex.absorbed
                    and self._pool_timeout is not None
                    and await self._room_within_pool_timeout(conn)
                ):
                    # The sidecar's queue was full; a place came free: send it again.
                    await self._send()
                    ex, conn = self._ex, self._conn
                    assert ex is not None and conn is not None
                    continue
                self._received += 1
                return item
            error = ex.error
            if error is not None:
                if isinstance(error, UnreadError) and self._resends < _MAX_RESENDS:
                    # The sidecar stopped on its own before reading this request.
                    self._resends += 1
                    await self._send()
                    ex, conn = self._ex, self._conn
                    assert ex is not None and conn is not None
                    continue
                raise error
            deadline, which = self._next_deadline(ex, conn)
            if deadline == math.inf:
                await ex.wait()
                continue
            if conn._clock() >= deadline:
                self._fire(which)
            await conn._wait_until(ex, deadline)

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
        room = conn._room_event()
        with anyio.move_on_at(limit):
            if room is not None:
                await room.wait()
            else:
                await anyio.sleep(self._busy_pause)
                self._busy_pause = min(2 * self._busy_pause + 0.001, _BUSY_PAUSE_MAX)
            return True
        return False

    def _next_deadline(self, ex: Exchange, conn: Channel) -> tuple[float, Deadline]:
        best, which = math.inf, "timeout"
        if self._deadline is not None:
            best = self._deadline
        if self._idle is not None:
            # Idle time counts from this request's last frame; while it waits in the
            # sidecar's queue, frames of the requests ahead of it count as progress too.
            base = ex.last_frame if ex.last_frame is not None else max(ex.sent_at, conn.last_activity)
            if base + self._idle < best:
                best, which = base + self._idle, "idle_timeout"
        return best, which  # type: ignore[return-value]

    def _fire(self, which: Deadline) -> None:
        rid = self.request_id
        name = "request" if rid is None else f"request {rid}"
        if which == "timeout":
            seconds = self._timeout or 0.0
            message = f"{name} did not finish within {seconds:g} s (timeout)"
        else:
            seconds = self._idle or 0.0
            message = f"{name}: no progress or audio from the sidecar for {seconds:g} s (idle_timeout)"
        raise RequestTimeoutError(message, deadline=which, seconds=seconds, request_id=rid)

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
        self._state = "failed"
        redact = self._conn._redact
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
        if self._state == "new":
            self._state = "closed"
            return
        if self._state == "running":
            self._give_up()
            self._state = "closed"
        if wait:
            await self._cancel_written()

    async def _cancel_written(self) -> None:
        """Wait (briefly) until the background ``cancel`` of this request is on the wire.

        Then a request sent next by the same task cannot overtake it.
        """
        sent = self._cancel_sent
        if sent is not None:
            with anyio.move_on_after(5.0):
                await sent.wait()


class _Call(_Tracked):
    """A request answered by one terminal frame (``ok``/``pong``), maybe after progress."""

    _reply: Union[protocol.Ok, protocol.Pong, None] = None

    async def _advance(self) -> Union[ProgressEvent, None]:
        reply = await self._next_reply()
        if isinstance(reply, protocol.Progress):
            event = ProgressEvent(reply.stage, reply.fraction, reply.message, reply.id)
            await self._notify(event)
            return event
        if isinstance(reply, (protocol.Ok, protocol.Pong)):
            self._reply = reply
            self._state = "done"
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
        assert self._reply is not None
        return self._reply


class Synthesis(_Tracked):
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
        #: Set by synthesize(), which never hands out chunks: the connection's reader
        #: assembles the audio as frames arrive, straight from the shared ring if any.
        self._assemble_in_reader = False
        self._audio: Union[Audio, None] = None
        #: The sidecar's seconds per phase, from ``done`` (empty until then).
        self.timings: dict[str, float] = {}
        #: The engine's facts about the request, from ``done`` (``voice_cache``...).
        self.facts: dict[str, Any] = {}
        #: Whether ``async with`` or an explicit start() made someone responsible for closing it.
        self._owned = False

    @property
    def finished(self) -> bool:
        """Whether the request ended (successfully, with an error, or closed)."""
        return self._state in ("done", "failed", "closed")

    async def _advance(self) -> Union[ProgressEvent, AudioChunk, None]:
        reply = await self._next_reply()
        assert self._ex is not None
        if self._assembler is None:
            self._assembler = AudioAssembler(self._ex.id, keep=self._keep)
        while isinstance(reply, protocol.Audio) and self._ex.sink is not None:
            # The connection's reader already put these samples into the assembler.
            if self._ex.sink_error is not None:
                raise self._ex.sink_error
            reply = await self._next_reply()
        if isinstance(reply, protocol.Audio):
            return self._assembler.add(reply.seq, reply.sample_rate, reply.pcm)
        if isinstance(reply, protocol.Progress):
            event = ProgressEvent(reply.stage, reply.fraction, reply.message, reply.id)
            await self._notify(event)
            return event
        if isinstance(reply, protocol.Done):
            self._state = "done"
            self._assembler.check_done(reply.samples, reply.chunks, reply.sample_rate)
            self.timings = dict(reply.timings)
            self.facts = dict(reply.facts)
            if self._keep:
                self._audio = Audio(
                    self._assembler.assemble(), reply.sample_rate, self.timings, reply.id, facts=self.facts
                )
            return None
        if isinstance(reply, protocol.Error):
            raise self._frame_error(reply)
        raise ProtocolError(f"unexpected {type(reply).__name__} frame for synthesize request {self.request_id}")

    def _streams_events(self) -> bool:
        return not self._assemble_in_reader

    def _registered(self, exchange: Exchange) -> None:
        if self._assemble_in_reader:
            self._assembler = exchange.sink = AudioAssembler(exchange.id, keep=True)

    async def start(self) -> None:
        """Send the request now (``async with`` does it for you); then :meth:`aclose` is yours to call."""
        self._owned = True
        if self._state == "new":
            try:
                await self._begin()
            except BaseException as exc:
                self._give_up()
                if isinstance(exc, Exception):
                    self._state, self._failure = "failed", exc
                else:
                    self._state = "closed"
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


class Requester:
    """The request methods shared by :class:`Client` and :class:`Connection`."""

    _default_timeout: Union[float, None] = None
    _default_idle_timeout: Union[float, None] = None
    _default_pool_timeout: Union[float, None] = None

    async def _connection(self) -> Channel:
        raise NotImplementedError

    def _synthesis(
        self,
        keep_audio: bool,
        text: str,
        voice: Union[str, None],
        emotion: EmotionLike,
        sample_rate: Union[int, None],
        on_progress: Union[ProgressCallback, None],
        timeout: TimeoutArg,
        idle_timeout: TimeoutArg,
        options: dict[str, Any],
        wants_progress: bool = True,
    ) -> Synthesis:
        idle = _resolve(idle_timeout, self._default_idle_timeout)
        # Nobody looks at this request's progress: ask the sidecar for none, except the signs of
        # life it sends after a quiet spell, which an idle deadline this long still sees in time.
        quiet = not wants_progress and on_progress is None and (idle is None or idle >= _QUIET_IDLE_MIN)
        return Synthesis(
            self._connection,
            _synthesize_builder(text, voice, emotion, sample_rate, options, progress=not quiet),
            keep_audio=keep_audio,
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=idle,
            on_progress=on_progress,
            pool_timeout=self._default_pool_timeout,
        )

    def request(
        self,
        text: str,
        *,
        voice: Union[str, None] = None,
        emotion: EmotionLike = None,
        sample_rate: Union[int, None] = None,
        on_progress: Union[ProgressCallback, None] = None,
        timeout: TimeoutArg = ...,
        idle_timeout: TimeoutArg = ...,
        **options: Any,
    ) -> Synthesis:
        """A synthesis whose progress events and audio chunks can be iterated, then its :class:`Audio`.

        ``async with client.request(text) as req: async for event in req.events(): ...``
        then ``audio = await req.result()``.  Keyword arguments beyond those named are
        engine request options (for ``fake``: ``seconds``, ``delay``...).
        """
        return self._synthesis(True, text, voice, emotion, sample_rate, on_progress, timeout, idle_timeout, options)

    def stream(
        self,
        text: str,
        *,
        voice: Union[str, None] = None,
        emotion: EmotionLike = None,
        sample_rate: Union[int, None] = None,
        on_progress: Union[ProgressCallback, None] = None,
        timeout: TimeoutArg = ...,
        idle_timeout: TimeoutArg = ...,
        **options: Any,
    ) -> Synthesis:
        """Stream the audio: ``async with client.stream(text) as chunks: async for chunk in chunks: ...``.

        Chunks are yielded as they arrive and not kept.  Leaving the ``async with``
        block early cancels the request on the sidecar.
        """
        return self._synthesis(False, text, voice, emotion, sample_rate, on_progress, timeout, idle_timeout, options)

    async def synthesize(
        self,
        text: str,
        *,
        voice: Union[str, None] = None,
        emotion: EmotionLike = None,
        sample_rate: Union[int, None] = None,
        on_progress: Union[ProgressCallback, None] = None,
        timeout: TimeoutArg = ...,  # noqa: ASYNC109 - a request deadline that also cancels it on the sidecar
        idle_timeout: TimeoutArg = ...,
        **options: Any,
    ) -> Audio:
        """Speak ``text`` and return the whole :class:`Audio`.

        ``on_progress`` (a function or coroutine function) receives each
        :class:`ProgressEvent` in this task.  ``timeout`` bounds the whole request,
        ``idle_timeout`` the time without a progress or audio frame (``...``: the
        client's default; None: no limit); either raises :class:`RequestTimeoutError`
        after cancelling the request.  Other keyword arguments are engine request options.
        """
        synthesis = self._synthesis(
            True, text, voice, emotion, sample_rate, on_progress, timeout, idle_timeout, options, wants_progress=False
        )
        synthesis._assemble_in_reader = True
        async with synthesis:
            return await synthesis.result()

    async def _call(
        self,
        build: _Build,
        *,
        timeout: Union[float, None],  # noqa: ASYNC109
        idle_timeout: Union[float, None],
        on_progress: Union[ProgressCallback, None] = None,
        cancellable: bool = True,
    ) -> _Call:
        call = _Call(
            self._connection,
            build,
            timeout=timeout,
            idle_timeout=idle_timeout,
            on_progress=on_progress,
            cancellable=cancellable,
        )
        await call.run()
        return call

    async def ping(self, *, timeout: TimeoutArg = ...) -> Health:  # noqa: ASYNC109
        """Health check, answered by the sidecar even while it synthesizes.

        Bounded by ``timeout`` and by the client's ``idle_timeout`` (the pong is its only frame).
        """
        call = await self._call(
            lambda i: protocol.Ping(id=i),
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=self._default_idle_timeout,
            cancellable=False,
        )
        pong, ex = call._reply, call._ex
        assert isinstance(pong, protocol.Pong) and ex is not None and ex.last_frame is not None
        return Health(
            round_trip=max(0.0, ex.last_frame - ex.sent_at),
            loaded=pong.loaded,
            queue_depth=pong.queue_depth,
            active=pong.active,
            memory=dict(pong.memory),
            uptime=pong.uptime,
            dropped_options=tuple(pong.dropped_options),
        )

    async def load(
        self,
        *,
        on_progress: Union[ProgressCallback, None] = None,
        timeout: TimeoutArg = ...,  # noqa: ASYNC109 - a request deadline that also cancels it on the sidecar
        idle_timeout: TimeoutArg = ...,
    ) -> LoadInfo:
        """Load the model now (warm-up), reporting progress; returns a :class:`LoadInfo`.

        Raises :class:`LoadFailedError` (retryable) when the model fails to load.
        """
        call = await self._call(
            lambda i: protocol.Load(id=i),
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=_resolve(idle_timeout, self._default_idle_timeout),
            on_progress=on_progress,
        )
        assert call._reply is not None
        return LoadInfo.from_reply(getattr(call._reply, "info", {}))

    async def unload(self, *, timeout: TimeoutArg = ...) -> None:  # noqa: ASYNC109
        """Drop the model and free its memory (the next request loads it again)."""
        await self._call(
            lambda i: protocol.Unload(id=i),
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=self._default_idle_timeout,
        )

    async def voices(self, *, timeout: TimeoutArg = ...) -> list[dict[str, Any]]:  # noqa: ASYNC109
        """The engine's named voices, each a map with at least ``name`` (espeak: also
        ``identifier`` and ``languages``).  Answered at once, without loading the model;
        an engine without named voices raises :class:`InvalidRequestError`.
        """
        call = await self._call(
            lambda i: protocol.Voices(id=i),
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=self._default_idle_timeout,
            cancellable=False,
        )
        assert isinstance(call._reply, protocol.Ok)
        return [dict(voice) for voice in call._reply.info.get("voices", [])]

    async def register_voice(
        self,
        name: str,
        audio: Union[bytes, bytearray, memoryview],
        *,
        timeout: TimeoutArg = ...,  # noqa: ASYNC109
    ) -> str:
        """Upload a reference clip to the sidecar, stored there under ``name``; returns the voice to use.

        For a sidecar on another machine, where a local path means nothing::

            voice = await client.register_voice("alice", Path("alice.wav").read_bytes())
            audio = await client.synthesize("Hello.", voice=voice)  # voice == "registered:alice"

        The sidecar needs ``--voice-dir`` (it keeps clips there, by content hash, bounded
        by ``--max-voice-bytes`` and ``--max-voices``); registering a name again replaces it.
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        data = bytes(audio)
        call = await self._call(
            lambda i: protocol.RegisterVoice(id=i, name=name, audio=data),
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=self._default_idle_timeout,
        )
        assert call._reply is not None
        info = dict(getattr(call._reply, "info", {}))
        return str(info.get("voice", protocol.REGISTERED_PREFIX + name))
