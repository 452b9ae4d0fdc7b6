"""``/v1/audio/speech/stream``: text in over a WebSocket, audio out, several contexts a connection.

The events are vllm-omni's (``session.config``, ``input.text``, ``input.done`` answered by
``audio.start``, binary frames, ``audio.done``), each with a ``context_id`` as in ElevenLabs'
multi-context sockets; docs/serving.md describes them one by one (:mod:`._ws_events` declares
them).  Each context is one ``stream_text`` of the backend over a :class:`TextFeed`, prepared
by the service as the speech route's body is: its sentences go to the sidecar as they are cut.

A binary frame is ``[n][context_id: n ASCII bytes][audio bytes]``: one byte of length, the
id, then the encoded audio of the sentence that the last ``audio.start`` of that context
announced.  A connection takes a slot of ``max_connections`` only once it has shown the key;
before, it is one of ``max_unauthenticated`` for at most ``auth_timeout`` seconds.  Every
wait has a bound (:class:`WebSocketLimits`, flags of ``serve``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol, Union

import anyio
from anyio.abc import TaskGroup
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect

from .._exceptions import SidecarError
from .._service import (
    PCM_RATE,
    Backend,
    Kind,
    Prepared,
    Refusal,
    SpeechSettings,
    VoiceSources,
    prepare,
    refusal_of,
)
from .._socket_events import (
    AudioAlignment,
    AudioDone,
    AudioStart,
    ContextCancelled,
    ContextDone,
    ServerError,
    ServerEvent,
    SessionReady,
    encode_event,
)
from .._stream_text import Fragment, SentenceChunk, SentenceEnd, TextFeed, TextStream
from ._alignment import alignment_words
from ._encoders import STREAMABLE, Encoder, check_available, make_encoder
from ._errors import HTTPError
from ._limits import Limits
from ._metrics import Metrics
from ._origins import Origins
from ._speech import encode_off_loop
from ._timing import Clock, member_of
from ._ws_events import (
    CONTEXT_ID,
    NORMAL,
    POLICY,
    TOO_BIG,
    TRY_LATER,
    ClientEvent,
    ContextCancel,
    ContextConfig,
    EventError,
    Fatal,
    InputDone,
    InputFlush,
    InputText,
    SessionConfig,
    WebSocketLimits,
    decode_event,
    log_reset,
)

__all__ = ["SpeechSocket", "WebSocketLimits"]

log = logging.getLogger("indextts_client.http")

#: What a context leaves out, and its session did not set.
DEFAULTS = SpeechSettings(response_format="pcm")


class SocketService(Protocol):
    """What the route needs of the app's service."""

    api_key: Union[str, None]
    backend: Backend
    sources: VoiceSources
    limits: Limits
    metrics: Metrics

    def key_ok(self, key: str) -> bool: ...

    def require_ready(self) -> None: ...


class _WriteTimeout(Exception):
    pass


class _Context:
    def __init__(self, context_id: str, settings: SpeechSettings, limit: int) -> None:
        self.id = context_id
        self.prefix = bytes([len(context_id)]) + context_id.encode("ascii")
        self.settings = settings
        # Unread fragments are at most ``limit`` (each has a character), flushes one per fragment:
        # ``send`` never waits, so one context's backlog never holds up the connection's events.
        self.feed = TextFeed(max_pending=2 * limit + 2)
        self.scope = anyio.CancelScope()
        self.pending = 0  # characters received and not yet read by the stream's splitter
        self.text_since_flush = False
        self.done = False  # input.done received: no more text
        self.cancelled = False
        self.ended = False  # its stream is over: text for it is refused


class _Reader:
    """The context's feed as its stream reads it, counting off the characters it takes."""

    def __init__(self, context: _Context) -> None:
        self.context = context

    def __aiter__(self) -> _Reader:
        return self

    async def __anext__(self) -> Fragment:
        piece = await self.context.feed.__anext__()
        if isinstance(piece, str):
            self.context.pending -= len(piece)
        return piece


class _Session:
    """One connection, from ``session.ready`` to its close."""

    def __init__(self, route: SpeechSocket, websocket: WebSocket, defaults: SpeechSettings) -> None:
        self.route, self.ws, self.limits = route, websocket, route.limits
        self.contexts: dict[str, _Context] = {}
        self.defaults = defaults
        self.send_lock = anyio.Lock()
        self.last_activity = anyio.current_time()
        self.task_group: Union[TaskGroup, None] = None
        self.broken = False  # a frame missed the write deadline
        self.gone = False  # the client went away (or does not read)
        self.fatal: Union[Fatal, None] = None

    # -------------------------------------------------------------- sending

    async def send_event(self, event: ServerEvent) -> None:
        await self._send({"type": "websocket.send", "text": encode_event(event)})

    async def send_bytes(self, data: bytes) -> None:
        await self._send({"type": "websocket.send", "bytes": data})

    async def _send(self, message: Message) -> None:
        if self.broken:
            raise _WriteTimeout
        async with self.send_lock:
            with anyio.move_on_after(self.limits.write_timeout) as deadline:
                await self.ws.send(message)
            if deadline.cancelled_caught:
                self.broken = True
                raise _WriteTimeout
        self.last_activity = anyio.current_time()

    async def error(
        self, code: str, message: str, context_id: Union[str, None] = None, param: Union[str, None] = None
    ) -> None:
        await self.send_event(ServerError(code=code, message=message, param=param, context_id=context_id))

    # -------------------------------------------------------------- receiving

    async def receive(self) -> Union[ClientEvent, None]:
        """The next event, None once the client has gone; the idle timeout raises :class:`Fatal`."""
        return await receive_event(self.ws, self.limits, lambda: self.last_activity, self._active)

    def _active(self) -> None:
        self.last_activity = anyio.current_time()

    # -------------------------------------------------------------- the loop

    async def run(self) -> None:
        try:
            await self.send_event(SessionReady())
            async with anyio.create_task_group() as tg:
                self.task_group = tg
                try:
                    await self.serve_events()
                except Fatal as exc:
                    self.fatal = exc
                except (_WriteTimeout, WebSocketDisconnect, OSError):
                    self.gone = True  # nothing raised here may leave the task group: it would be wrapped
                finally:
                    for context in self.contexts.values():
                        context.scope.cancel()
        except (_WriteTimeout, WebSocketDisconnect, OSError):
            self.gone = True
        await close(self.ws, self.limits, self.fatal, broken=self.broken, gone=self.gone)

    def abort(self) -> None:
        """The client is gone or does not read: every context ends, the connection closes."""
        self.gone = True
        if self.task_group is not None:
            self.task_group.cancel_scope.cancel()

    async def serve_events(self) -> None:
        while True:
            try:
                event = await self.receive()
                if event is None:
                    return
                await self.handle(event)
            except EventError as exc:
                await self.error(exc.code, exc.message, exc.context_id, exc.param)

    async def handle(self, event: ClientEvent) -> None:
        match event:
            case SessionConfig():
                if event.api_key is not None and not self.route.service.key_ok(event.api_key):
                    raise Fatal(POLICY, "invalid_api_key", "wrong API key")
                self.defaults = self.defaults.merged(event)
                return
            case _ if not CONTEXT_ID.fullmatch(event.context_id):
                raise EventError("invalid_context_id", "context_id is 1 to 64 of A-Z a-z 0-9 _ . : -")
        context_id = event.context_id
        context = self.contexts.get(context_id)
        match event:
            case ContextConfig():
                if context is not None:
                    raise EventError("context_exists", f"context {context_id!r} is open", context_id)
                await self.open(context_id, self.defaults.merged(event))
            case ContextCancel():
                if context is None:
                    raise EventError("no_such_context", f"no open context {context_id!r}", context_id)
                context.cancelled = True
                context.scope.cancel()
            case InputText():
                if context is None:
                    context = await self.open(context_id, self.defaults)
                self.check_open(context)
                await self.append(context, event.text)
            case InputFlush():
                self.check_open(self.existing(context, context_id))
                if context is not None and context.text_since_flush:  # an empty turn has nothing to speak
                    context.text_since_flush = False
                    await self.feed(context, context.feed.flush)
            case InputDone():
                context = self.existing(context, context_id)
                self.check_open(context)
                context.done = True
                context.feed.close()

    @staticmethod
    def existing(context: Union[_Context, None], context_id: str) -> _Context:
        if context is None:
            raise EventError("no_such_context", f"no open context {context_id!r}", context_id)
        return context

    @staticmethod
    def check_open(context: _Context) -> None:
        if context.done:
            raise EventError("context_done", f"context {context.id!r} has had input.done", context.id)
        if context.ended:
            raise EventError("context_ended", f"context {context.id!r} has ended", context.id)

    async def feed(self, context: _Context, step: Callable[[], Awaitable[None]]) -> None:
        """A step on the context's feed; its stream may have ended meanwhile (it failed while
        the client was still sending): then that text is refused, the connection stays."""
        try:
            await step()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            context.ended = True
            raise EventError("context_ended", f"context {context.id!r} has ended", context.id) from None

    async def append(self, context: _Context, text: str) -> None:
        if not text:
            raise EventError("empty_text", "input.text's text is empty", context.id, "text")
        limit = self.limits.max_pending_chars
        if context.pending + len(text) > limit:
            raise EventError(
                "too_much_pending_text",
                f"context {context.id!r} would hold over {limit} characters not yet taken; "
                "this text was not taken: send it again after some audio",
                context.id,
                "text",
            )
        await self.feed(
            context, partial(context.feed.send, text)
        )  # never waits: the feed holds more than pending allows
        context.pending += len(text)
        context.text_since_flush = True

    async def open(self, context_id: str, settings: SpeechSettings) -> _Context:
        if len(self.contexts) >= self.limits.max_contexts:
            raise EventError(
                "too_many_contexts", f"a connection has at most {self.limits.max_contexts} contexts open", context_id
            )
        service = self.route.service
        try:
            if settings.response_format not in STREAMABLE:
                raise Refusal(
                    Kind.INVALID,
                    f"response_format {settings.response_format} does not stream: use pcm, wav, mp3, opus or aac",
                    param="response_format",
                    code="unsupported_format",
                )
            check_available(settings.response_format)
            prepared = await prepare(
                settings,
                service.backend.facts,
                service.sources,
                max_input=service.limits.max_input,
                max_silence=service.limits.max_silence,
            )
        except Refusal as refusal:
            raise EventError.of(refusal, context_id) from None
        context = _Context(context_id, settings, self.limits.max_pending_chars)
        self.contexts[context_id] = context
        assert self.task_group is not None
        self.task_group.start_soon(self.speak, context, prepared)
        return context

    # -------------------------------------------------------------- one context

    async def speak(self, context: _Context, prepared: Prepared) -> None:
        failure: Union[Refusal, None] = None
        try:
            with context.scope:
                async with self.route.service.backend.stream_text(_Reader(context), prepared) as stream:
                    await self.deliver(context, stream, prepared.sample_rate)
        except SidecarError as exc:
            failure = refusal_of(exc)
        except (_WriteTimeout, WebSocketDisconnect, OSError):
            self.abort()
            return
        except Exception as exc:
            log.error("websocket context %r failed", context.id, exc_info=exc)
            failure = Refusal(Kind.INTERNAL, f"the context failed ({type(exc).__name__})", code="server_error")
        finally:
            context.ended = True
            context.feed.stop()
            self.contexts.pop(context.id, None)
        if context.scope.cancel_called and not context.cancelled:
            return  # the connection is ending
        try:
            if failure is not None:
                await self.error(failure.code, failure.message, context.id, failure.param)
            else:
                end = ContextCancelled if context.cancelled else ContextDone
                await self.send_event(end(context_id=context.id))
        except (_WriteTimeout, WebSocketDisconnect, OSError):
            self.abort()

    async def deliver(self, context: _Context, stream: TextStream, rate: Union[int, None]) -> None:
        fmt = context.settings.response_format
        encoder: Union[Encoder, None] = None
        sent, chunk_rate = 0, 0
        arrivals: list[float] = []  # the sentence's chunks', for the metrics
        async for event in stream.events():
            match event:
                case SentenceChunk():
                    arrivals.append(time.perf_counter())
                    chunk_rate = event.sample_rate
                    if encoder is None:
                        encoder = make_encoder(fmt, event.sample_rate, streamed=True)
                        await self.start(context, event.sentence, event.text, event.sample_rate)
                    data = await encode_off_loop(encoder, partial(encoder.feed, event.samples))
                    if data:
                        sent += len(data)
                        await self.send_bytes(context.prefix + data)
                case SentenceEnd():
                    if encoder is None:  # a sentence without audio: still a whole (empty) answer
                        encoder = make_encoder(fmt, rate or PCM_RATE, streamed=True)
                        await self.start(context, event.sentence, event.text, encoder.rate)
                    tail = await encode_off_loop(encoder, encoder.finish)
                    if tail:
                        sent += len(tail)
                        await self.send_bytes(context.prefix + tail)
                    encoder = None
                    self.route.served(event, chunk_rate, arrivals)  # before audio.done: who saw it sees them
                    words = alignment_words(event.words)
                    granularity = self.route.service.backend.facts.granularity
                    cid, sentence = context.id, event.sentence
                    aligned = AudioAlignment(context_id=cid, sentence=sentence, granularity=granularity, words=words)
                    await self.send_event(aligned)
                    done = AudioDone(
                        context_id=cid, sentence=sentence, samples=event.samples, bytes=sent, flushed=event.flushed
                    )
                    await self.send_event(done)
                    sent, chunk_rate, arrivals = 0, 0, []

    async def start(self, context: _Context, sentence: int, text: str, rate: int) -> None:
        await self.send_event(
            AudioStart(
                context_id=context.id,
                sentence=sentence,
                text=text,
                response_format=context.settings.response_format,
                sample_rate=rate,
            )
        )


async def receive_event(
    ws: WebSocket,
    limits: WebSocketLimits,
    last_activity: Callable[[], float],
    active: Callable[[], None],
    deadline: Union[float, None] = None,
) -> Union[ClientEvent, None]:
    """The next event, None once the client has gone.  Past the idle timeout (from the last
    activity), or ``deadline`` (an absolute time), :class:`Fatal`."""
    while True:
        now = anyio.current_time()
        wait = last_activity() + limits.idle_timeout - now
        if deadline is not None and deadline - now < wait:
            if deadline <= now:
                raise Fatal(POLICY, "auth_timeout", f"no session.config with the key within {limits.auth_timeout:g} s")
            wait = deadline - now
        if wait <= 0:
            raise Fatal(POLICY, "idle_timeout", f"no message or audio for {limits.idle_timeout:g} s")
        with anyio.move_on_after(wait):
            message = await ws.receive()
            break
    if message["type"] == "websocket.disconnect":
        return None
    active()
    text, data = message.get("text"), message.get("bytes")
    size = len(data) if data is not None else len(text.encode()) if text is not None else 0
    if size > limits.max_message:
        raise Fatal(TOO_BIG, "message_too_large", f"a message is over {limits.max_message} bytes")
    if text is None:
        raise EventError("invalid_event", "binary messages are not events: send JSON text")
    return decode_event(text)


async def close(ws: WebSocket, limits: WebSocketLimits, fatal: Union[Fatal, None], *, broken: bool, gone: bool) -> None:
    if broken:
        log_reset(ws.scope, f"the client read nothing for {limits.write_timeout:g} s")
        return  # a close frame would wait behind what the client does not read: the protocol resets it
    if gone:
        return
    code, reason = NORMAL, ""
    with anyio.move_on_after(limits.write_timeout):
        try:
            if fatal is not None:
                code, reason = fatal.close, fatal.code
                log.info("websocket closed: %s: %s", fatal.code, fatal.message)
                await ws.send(
                    {
                        "type": "websocket.send",
                        "text": encode_event(ServerError(code=fatal.code, message=fatal.message)),
                    }
                )
            await ws.close(code, reason)
        except (WebSocketDisconnect, OSError, RuntimeError):
            pass  # the client closed first


# ------------------------------------------------------------------ the route


class SpeechSocket:
    """The endpoint: admission (origin, key, budgets), then one :class:`_Session` per connection."""

    def __init__(self, service: SocketService, limits: WebSocketLimits, origins: Origins) -> None:
        self.service, self.limits, self.origins = service, limits, origins
        self.connections = 0  # with the key
        self.unauthenticated = 0  # not yet

    def served(self, end: SentenceEnd, rate: int, arrivals: list[float]) -> None:
        """A sentence spoken to its end: the speech route's latency metrics, per sentence, from
        its request being sent (the sentence cut) to its first chunk and its end."""
        clock = Clock.of_sentence(end, rate, arrivals)
        engine, member = self.service.backend.facts.name, member_of(end)
        self.service.metrics.timing.first(engine, member, clock)
        self.service.metrics.timing.served(engine, member, clock)

    def _refusal(self, websocket: WebSocket, keyed: bool) -> Union[Refusal, None]:
        refusal = self.origins.refusal(websocket.scope)
        if refusal is not None:
            return refusal
        header = websocket.headers.get("authorization")
        if header is not None and not keyed:
            return Refusal(
                Kind.UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer KEY)", code="invalid_api_key"
            )
        if keyed and self.connections >= self.limits.max_connections:
            return Refusal(Kind.OVERLOADED, "the server has too many WebSocket connections", code="overloaded")
        if not keyed and self.unauthenticated >= self.limits.max_unauthenticated:
            return Refusal(
                Kind.OVERLOADED, "the server has too many WebSocket connections without the key", code="overloaded"
            )
        try:
            self.service.require_ready()
        except Refusal as exc:
            return exc
        return None

    def _header_key(self, websocket: WebSocket) -> bool:
        scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.service.key_ok(token.strip())

    async def __call__(self, websocket: WebSocket) -> None:
        keyed = self.service.api_key is None or self._header_key(websocket)
        refusal = self._refusal(websocket, keyed)
        if refusal is not None:
            await _deny(websocket, refusal)
            return
        if keyed:
            self.connections += 1
            try:
                await websocket.accept()
                await _Session(self, websocket, DEFAULTS).run()
            finally:
                self.connections -= 1
            return
        self.unauthenticated += 1
        try:
            await websocket.accept()
            defaults = await self._authenticate(websocket)
        finally:
            self.unauthenticated -= 1
        if defaults is None:
            return
        if self.connections >= self.limits.max_connections:
            fatal = Fatal(TRY_LATER, "overloaded", "the server has too many WebSocket connections")
            await close(websocket, self.limits, fatal, broken=False, gone=False)
            return
        self.connections += 1
        try:
            await _Session(self, websocket, defaults).run()
        finally:
            self.connections -= 1

    async def _authenticate(self, websocket: WebSocket) -> Union[SpeechSettings, None]:
        """The session's first event, ``session.config`` with the key, within ``auth_timeout``;
        its settings, or None once the connection is closed."""
        deadline = anyio.current_time() + self.limits.auth_timeout
        started = anyio.current_time()
        fatal = Fatal(
            POLICY,
            "invalid_api_key",
            "missing or wrong API key (Authorization: Bearer KEY, or session.config's api_key first)",
        )
        try:
            event = await receive_event(websocket, self.limits, lambda: started, lambda: None, deadline)
        except EventError:
            event = None
        except Fatal as exc:
            fatal = exc
            event = None
        except (WebSocketDisconnect, OSError):
            return None
        if isinstance(event, SessionConfig) and event.api_key is not None and self.service.key_ok(event.api_key):
            return DEFAULTS.merged(event)
        await close(websocket, self.limits, fatal, broken=False, gone=False)
        return None


async def _deny(websocket: WebSocket, refusal: Refusal) -> None:
    """The refusal as an HTTP answer to the handshake where the server can send one, else a close."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(HTTPError(refusal).response())
    else:
        close_code = TRY_LATER if refusal.kind in (Kind.OVERLOADED, Kind.STARTING) else POLICY
        await websocket.close(close_code, refusal.code)
