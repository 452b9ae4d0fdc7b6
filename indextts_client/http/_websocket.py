"""``/v1/audio/speech/stream``: text in over a WebSocket, audio out, several contexts a connection.

The events are vllm-omni's (``session.config``, ``input.text``, ``input.done`` answered by
``audio.start``, binary frames, ``audio.done``), each with a ``context_id`` as in ElevenLabs'
multi-context sockets; docs/serving.md describes them one by one.  Each context is one
:meth:`Pool.stream_text` over a :class:`TextFeed`: its sentences go to the sidecar as they
are cut, on the member that holds its voice warm.

A binary frame is ``[n][context_id: n ASCII bytes][audio bytes]``: one byte of length, the
id, then the encoded audio of the sentence that the last ``audio.start`` of that context
announced.  Every wait has a bound (:class:`WebSocketLimits`, flags of ``serve``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import logging
import re
import socket
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

import anyio
import msgspec
from anyio.abc import TaskGroup
from starlette.websockets import WebSocket, WebSocketDisconnect

from indextts_sidecar.protocol import Emotion

from .._exceptions import SidecarError
from .._stream_text import SentenceChunk, SentenceEnd, TextFeed
from ._emotion import emotion_for
from ._encoders import Encoder, check_available, make_encoder
from ._errors import HTTPError, error_for
from ._schema import check_instructions, engine_options
from ._speech import PCM_RATE, encode_off_loop
from ._timing import Clock, member_of

__all__ = ["WebSocketLimits", "WebSocketRoute", "stall_aborting_protocol"]

log = logging.getLogger("indextts_client.http")

#: Close codes (RFC 6455 section 7.4.1).
_NORMAL, _POLICY, _TOO_BIG, _TRY_LATER = 1000, 1008, 1009, 1013
_CONTEXT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
StreamFormat = Literal["mp3", "opus", "aac", "wav", "pcm"]


@dataclass(frozen=True)
class WebSocketLimits:
    """What one WebSocket client may make the server hold or wait for (``serve`` flags in brackets)."""

    #: Connections on the route at once; one more is refused with 503 [--ws-max-connections].
    max_connections: int = 64
    #: Contexts open at once on one connection [--ws-max-contexts].
    max_contexts: int = 8
    #: Bytes of one message from the client, text or binary [--ws-max-message].
    max_message: int = 64 * 1024
    #: Characters of one context's text received and not yet taken by its sentence splitter
    #: (which holds at most ``lookahead + 2`` sentences more) [--ws-max-pending-chars].
    max_pending_chars: int = 16 * 1024
    #: Seconds without a client message or an audio frame before the connection is closed [--ws-idle-timeout].
    idle_timeout: float = 60.0
    #: Seconds one frame may take to reach a client that does not read; past it the
    #: connection's contexts are cancelled and it is closed [--ws-write-timeout].
    write_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_contexts", "max_message", "max_pending_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"WebSocketLimits.{name} must be a positive int, not {value!r}")
        for name in ("idle_timeout", "write_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"WebSocketLimits.{name} must be positive")


# ------------------------------------------------------------------ the client's events


class _Settings(msgspec.Struct, kw_only=True, frozen=True):
    """A context's settings as an event gives them: what it leaves out is ``UNSET``."""

    voice: Union[str, msgspec.UnsetType, None] = msgspec.UNSET
    response_format: Union[StreamFormat, msgspec.UnsetType] = msgspec.UNSET
    sample_rate: Union[Annotated[int, msgspec.Meta(ge=8000, le=48000)], msgspec.UnsetType, None] = msgspec.UNSET
    speed: Union[Annotated[float, msgspec.Meta(ge=0.25, le=4.0)], msgspec.UnsetType] = msgspec.UNSET
    options: Union[dict[str, Any], msgspec.UnsetType] = msgspec.UNSET
    #: The speech route's emotion fields (:mod:`._emotion`), with the same meaning and checks.
    instructions: Union[str, msgspec.UnsetType, None] = msgspec.UNSET
    emotion: Union[dict[str, float], msgspec.UnsetType, None] = msgspec.UNSET
    emotion_reference: Union[str, msgspec.UnsetType, None] = msgspec.UNSET
    emotion_strength: Union[Annotated[float, msgspec.Meta(ge=0.0, le=1.0)], msgspec.UnsetType, None] = msgspec.UNSET


@dataclass(frozen=True)
class Settings:
    """A context's settings, whole: the event's, else the session's, else these defaults."""

    voice: Union[str, None] = None
    response_format: str = "pcm"
    sample_rate: Union[int, None] = None
    speed: float = 1.0
    options: Mapping[str, Any] = field(default_factory=dict)
    instructions: Union[str, None] = None
    emotion: Union[dict[str, float], None] = None
    emotion_reference: Union[str, None] = None
    emotion_strength: Union[float, None] = None


class SessionConfig(_Settings, tag="session.config", tag_field="type", kw_only=True, frozen=True):
    """The connection's defaults for the contexts it opens later, and the API key."""

    api_key: Union[str, None] = None


class ContextConfig(_Settings, tag="context.config", tag_field="type", kw_only=True, frozen=True):
    """Open a context with its own settings (the session's defaults for what it leaves out)."""

    context_id: str = "default"


class _ContextEvent(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    context_id: str = "default"


class InputText(_ContextEvent, tag="input.text", kw_only=True, frozen=True):
    text: str


class InputFlush(_ContextEvent, tag="input.flush", kw_only=True, frozen=True):
    pass


class InputDone(_ContextEvent, tag="input.done", kw_only=True, frozen=True):
    pass


class ContextCancel(_ContextEvent, tag="context.cancel", kw_only=True, frozen=True):
    pass


ClientEvent = Union[SessionConfig, ContextConfig, InputText, InputFlush, InputDone, ContextCancel]
_decoder = msgspec.json.Decoder(ClientEvent)
_SETTINGS = tuple(_Settings.__struct_fields__)


class _EventError(Exception):
    """A client event that is refused: an ``error`` event, the connection stays open."""

    def __init__(self, code: str, message: str, context_id: Union[str, None] = None) -> None:
        super().__init__(message)
        self.code, self.message, self.context_id = code, message, context_id


class _Fatal(Exception):
    """The connection ends: an ``error`` event (when it can still be sent), then this close code."""

    def __init__(self, close: int, code: str, message: str) -> None:
        super().__init__(message)
        self.close, self.code, self.message = close, code, message


class _WriteTimeout(Exception):
    pass


# ------------------------------------------------------------------ one connection


class _Context:
    def __init__(self, context_id: str, settings: Settings, limit: int) -> None:
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


class _Reader:
    """The context's feed as its stream reads it, counting off the characters it takes."""

    def __init__(self, context: _Context) -> None:
        self.context = context

    def __aiter__(self) -> _Reader:
        return self

    async def __anext__(self) -> Any:
        piece = await self.context.feed.__anext__()
        if isinstance(piece, str):
            self.context.pending -= len(piece)
        return piece


class _Connection:
    def __init__(self, route: WebSocketRoute, websocket: WebSocket) -> None:
        self.route, self.ws, self.limits = route, websocket, route.limits
        self.contexts: dict[str, _Context] = {}
        self.defaults = Settings()
        self.send_lock = anyio.Lock()
        self.last_activity = anyio.current_time()
        self.task_group: Union[TaskGroup, None] = None
        self.broken = False  # a frame missed the write deadline
        self.gone = False  # the client went away (or does not read)
        self.fatal: Union[_Fatal, None] = None

    # -------------------------------------------------------------- sending

    async def send_json(self, event: dict[str, Any]) -> None:
        await self._send({"type": "websocket.send", "text": msgspec.json.encode(event).decode()})

    async def send_bytes(self, data: bytes) -> None:
        await self._send({"type": "websocket.send", "bytes": data})

    async def _send(self, message: dict[str, Any]) -> None:
        if self.broken:
            raise _WriteTimeout
        async with self.send_lock:
            with anyio.move_on_after(self.limits.write_timeout) as deadline:
                await self.ws.send(message)
            if deadline.cancelled_caught:
                self.broken = True
                raise _WriteTimeout
        self.last_activity = anyio.current_time()

    async def error(self, code: str, message: str, context_id: Union[str, None] = None) -> None:
        event: dict[str, Any] = {"type": "error", "code": code, "message": message}
        if context_id is not None:
            event["context_id"] = context_id
        await self.send_json(event)

    # -------------------------------------------------------------- receiving

    async def receive(self) -> Union[ClientEvent, None]:
        """The next event, None once the client has gone; the idle timeout raises :class:`_Fatal`."""
        while True:
            wait = self.last_activity + self.limits.idle_timeout - anyio.current_time()
            if wait <= 0:
                raise _Fatal(_POLICY, "idle_timeout", f"no message or audio for {self.limits.idle_timeout:g} s")
            with anyio.move_on_after(wait):
                message = await self.ws.receive()
                break
        if message["type"] == "websocket.disconnect":
            return None
        self.last_activity = anyio.current_time()
        text, data = message.get("text"), message.get("bytes")
        size = len(data) if data is not None else len(text.encode()) if text is not None else 0
        if size > self.limits.max_message:
            raise _Fatal(_TOO_BIG, "message_too_large", f"a message is over {self.limits.max_message} bytes")
        if text is None:
            raise _EventError("invalid_event", "binary messages are not events: send JSON text")
        try:
            return _decoder.decode(text)
        except msgspec.ValidationError as exc:
            raise _EventError("invalid_event", f"invalid event: {exc}") from None
        except msgspec.DecodeError as exc:
            raise _EventError("invalid_event", f"an event is one JSON object: {exc}") from None

    async def authenticate(self, header_ok: bool) -> None:
        """With a key on the server and none in the handshake, the first event is
        ``session.config`` with ``api_key``."""
        key = self.route.api_key
        if key is None or header_ok:
            return
        try:
            event = await self.receive()
        except _EventError:
            event = None
        if not (
            isinstance(event, SessionConfig)
            and event.api_key is not None
            and hmac.compare_digest(event.api_key.encode(), key.encode())
        ):
            raise _Fatal(
                _POLICY,
                "invalid_api_key",
                "missing or wrong API key (Authorization: Bearer KEY, or session.config's api_key first)",
            )
        self.defaults = _settings_of(event, self.defaults)

    # -------------------------------------------------------------- the loop

    async def run(self, header_ok: bool) -> None:
        try:
            await self.authenticate(header_ok)
            await self.send_json({"type": "session.ready"})
            async with anyio.create_task_group() as tg:
                self.task_group = tg
                try:
                    await self.serve_events()
                except _Fatal as exc:
                    self.fatal = exc
                except (_WriteTimeout, WebSocketDisconnect, OSError):
                    self.gone = True  # nothing raised here may leave the task group: it would be wrapped
                finally:
                    for context in self.contexts.values():
                        context.scope.cancel()
        except _Fatal as exc:
            self.fatal = exc
        except (_WriteTimeout, WebSocketDisconnect, OSError):
            self.gone = True
        await self.close()

    def abort(self) -> None:
        """The client is gone or does not read: every context ends, the connection closes."""
        self.gone = True
        if self.task_group is not None:
            self.task_group.cancel_scope.cancel()

    async def close(self) -> None:
        if self.broken:
            log.warning("websocket closed: a frame waited over %g s for the client", self.limits.write_timeout)
            return  # a close frame would wait behind what the client does not read: uvicorn drops the transport
        if self.gone:
            return
        close, reason = _NORMAL, ""
        with anyio.move_on_after(self.limits.write_timeout):
            try:
                if self.fatal is not None:
                    close, reason = self.fatal.close, self.fatal.code
                    log.info("websocket closed: %s: %s", self.fatal.code, self.fatal.message)
                    await self.error(self.fatal.code, self.fatal.message)
                await self.ws.close(close, reason)
            except (_WriteTimeout, WebSocketDisconnect, OSError, RuntimeError):
                pass  # the client closed first

    async def serve_events(self) -> None:
        while True:
            try:
                event = await self.receive()
                if event is None:
                    return
                await self.handle(event)
            except _EventError as exc:
                await self.error(exc.code, exc.message, exc.context_id)

    async def handle(self, event: ClientEvent) -> None:
        if isinstance(event, SessionConfig):
            if event.api_key is not None and not self.route.key_ok(event.api_key):
                raise _Fatal(_POLICY, "invalid_api_key", "wrong API key")
            self.defaults = _settings_of(event, self.defaults)
            return
        context_id = event.context_id
        if not _CONTEXT_ID.fullmatch(context_id):
            raise _EventError("invalid_context_id", "context_id is 1 to 64 of A-Z a-z 0-9 _ . : -")
        context = self.contexts.get(context_id)
        if isinstance(event, ContextConfig):
            if context is not None:
                raise _EventError("context_exists", f"context {context_id!r} is open", context_id)
            await self.open(context_id, _settings_of(event, self.defaults))
            return
        if isinstance(event, ContextCancel):
            if context is not None:
                context.cancelled = True
                context.scope.cancel()
            else:
                raise _EventError("no_such_context", f"no open context {context_id!r}", context_id)
            return
        if context is None:
            if not isinstance(event, InputText):
                raise _EventError("no_such_context", f"no open context {context_id!r}", context_id)
            context = await self.open(context_id, self.defaults)
        if context.done:
            raise _EventError("context_done", f"context {context_id!r} has had input.done", context_id)
        if isinstance(event, InputText):
            await self.append(context, event.text)
        elif isinstance(event, InputFlush):
            if context.text_since_flush:  # an empty turn has nothing to speak: nothing to queue
                context.text_since_flush = False
                await context.feed.flush()
        else:
            context.done = True
            context.feed.close()

    async def append(self, context: _Context, text: str) -> None:
        if not text:
            raise _EventError("empty_text", "input.text's text is empty", context.id)
        limit = self.limits.max_pending_chars
        if context.pending + len(text) > limit:
            raise _EventError(
                "too_much_pending_text",
                f"context {context.id!r} would hold over {limit} characters not yet taken; "
                "this text was not taken: send it again after some audio",
                context.id,
            )
        context.pending += len(text)
        context.text_since_flush = True
        await context.feed.send(text)  # never waits: the feed holds more fragments than pending allows

    async def open(self, context_id: str, settings: Settings) -> _Context:
        if len(self.contexts) >= self.limits.max_contexts:
            raise _EventError(
                "too_many_contexts", f"a connection has at most {self.limits.max_contexts} contexts open", context_id
            )
        try:
            check_available(settings.response_format)
            voice = await self.route.resolve_voice(settings.voice)
            options = engine_options(settings.options)
            options.update(self.route.speed_options(settings.speed, options))
            emotion = await self.route.emotion_of(settings)
        except HTTPError as exc:
            raise _EventError(exc.code, exc.message, context_id) from None
        context = _Context(context_id, settings, self.limits.max_pending_chars)
        self.contexts[context_id] = context
        assert self.task_group is not None
        self.task_group.start_soon(self.speak, context, voice, emotion, options)
        return context

    # -------------------------------------------------------------- one context

    async def speak(
        self, context: _Context, voice: Union[str, None], emotion: Union[Emotion, None], options: dict[str, Any]
    ) -> None:
        settings = context.settings
        rate = settings.sample_rate or (PCM_RATE if settings.response_format == "pcm" else None)
        failure: Union[tuple[str, str], None] = None
        try:
            with context.scope:
                reader = _Reader(context)
                stream = self.route.stream_text(reader, voice=voice, emotion=emotion, sample_rate=rate, **options)
                async with stream:
                    await self.deliver(context, stream, rate)
        except SidecarError as exc:
            error = error_for(exc)
            failure = (error.code, error.message)
        except (_WriteTimeout, WebSocketDisconnect, OSError):
            self.abort()
            return
        except Exception as exc:
            log.error("websocket context %r failed", context.id, exc_info=exc)
            failure = ("server_error", f"the context failed ({type(exc).__name__})")
        finally:
            context.feed.stop()
            self.contexts.pop(context.id, None)
        if context.scope.cancel_called and not context.cancelled:
            return  # the connection is ending
        try:
            if failure is not None:
                await self.error(failure[0], failure[1], context.id)
            else:
                end = "context.cancelled" if context.cancelled else "context.done"
                await self.send_json({"type": end, "context_id": context.id})
        except (_WriteTimeout, WebSocketDisconnect, OSError):
            self.abort()

    async def deliver(self, context: _Context, stream: Any, rate: Union[int, None]) -> None:
        fmt = context.settings.response_format
        encoder: Union[Encoder, None] = None
        sent, chunk_rate = 0, 0
        arrivals: list[float] = []  # the sentence's chunks', for the metrics
        async for event in stream.events():
            if isinstance(event, SentenceChunk):
                arrivals.append(time.perf_counter())
                chunk_rate = event.sample_rate
                if encoder is None:
                    encoder = make_encoder(fmt, event.sample_rate, streamed=True)
                    await self.start(context, event.sentence, event.text, event.sample_rate)
                data = await encode_off_loop(encoder, encoder.feed, event.samples)
                if data:
                    sent += len(data)
                    await self.send_bytes(context.prefix + data)
                continue
            assert isinstance(event, SentenceEnd)
            if encoder is None:  # a sentence without audio: still a whole (empty) answer
                encoder = make_encoder(fmt, rate or PCM_RATE, streamed=True)
                await self.start(context, event.sentence, event.text, encoder.rate)
            tail = await encode_off_loop(encoder, encoder.finish)
            if tail:
                sent += len(tail)
                await self.send_bytes(context.prefix + tail)
            encoder = None
            self.route.served(event, chunk_rate, arrivals)  # before audio.done: a client that saw it sees them
            done = {"type": "audio.done", "context_id": context.id, "sentence": event.sentence}
            await self.send_json({**done, "samples": event.samples, "bytes": sent, "flushed": event.flushed})
            sent, chunk_rate, arrivals = 0, 0, []

    async def start(self, context: _Context, sentence: int, text: str, rate: int) -> None:
        await self.send_json(
            {
                "type": "audio.start",
                "context_id": context.id,
                "sentence": sentence,
                "text": text,
                "response_format": context.settings.response_format,
                "sample_rate": rate,
            }
        )


def _settings_of(event: _Settings, defaults: Settings) -> Settings:
    """The settings ``event`` gives, the others from ``defaults``."""
    given = {name: getattr(event, name) for name in _SETTINGS if getattr(event, name) is not msgspec.UNSET}
    return dataclasses.replace(defaults, **given)


# ------------------------------------------------------------------ the route


class WebSocketRoute:
    """The endpoint; ``service`` is the app's ``_Service`` (its key, readiness, voices, backend)."""

    def __init__(self, service: Any, limits: WebSocketLimits) -> None:
        self.service, self.limits = service, limits
        self.api_key: Union[str, None] = service.api_key
        self.resolve_voice: Callable[[Union[str, None]], Any] = service.voices.resolve
        self.speed_options: Callable[..., dict[str, Any]] = service.speed_options
        self.connections = 0

    async def emotion_of(self, settings: Settings) -> Union[Emotion, None]:
        """The protocol emotion a context's settings ask for, checked as the speech route checks its body."""
        check_instructions(settings.instructions, self.service.limits.max_input)
        return await emotion_for(settings, self.service.backend.facts, self.resolve_voice)

    def served(self, end: SentenceEnd, rate: int, arrivals: list[float]) -> None:
        """A sentence spoken to its end: the speech route's latency metrics, per sentence, from
        its request being sent (the sentence cut) to its first chunk and its end."""
        clock = Clock.of_sentence(end, rate, arrivals)
        engine, member = self.service.backend.facts.name, member_of(end)
        self.service.metrics.timing.first(engine, member, clock)
        self.service.metrics.timing.served(engine, member, clock)

    def key_ok(self, key: str) -> bool:
        return self.api_key is None or hmac.compare_digest(key.encode(), self.api_key.encode())

    def stream_text(self, texts: Any, **kwargs: Any) -> Any:
        return self.service.backend.stream_text(texts, **kwargs)

    async def __call__(self, websocket: WebSocket) -> None:
        header = websocket.headers.get("authorization")
        header_ok = header is not None and self.service.authorized(websocket)
        refusal: Union[HTTPError, None] = None
        if header is not None and not header_ok:
            refusal = HTTPError(401, "missing or wrong API key (Authorization: Bearer KEY)", code="invalid_api_key")
        elif self.connections >= self.limits.max_connections:
            refusal = HTTPError(
                503, "the server has too many WebSocket connections", code="overloaded", headers={"Retry-After": "1"}
            )
        else:
            try:
                self.service.require_ready()
            except HTTPError as exc:
                refusal = exc
        if refusal is not None:
            await _deny(websocket, refusal)
            return
        self.connections += 1
        try:
            await websocket.accept()
            await _Connection(self, websocket).run(header_ok)
        finally:
            self.connections -= 1


async def _deny(websocket: WebSocket, refusal: HTTPError) -> None:
    """The refusal as an HTTP answer to the handshake where the server can send one, else a close."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(refusal.response())
    else:
        await websocket.close(_TRY_LATER if refusal.status == 503 else _POLICY, refusal.code or "")


def stall_aborting_protocol() -> type[Any]:
    """uvicorn's WebSocket protocol (on the ``websockets`` package) that drops a connection whose
    client has stopped reading, once the app is done with it or a keepalive ping went unanswered.

    uvicorn ends a connection with ``transport.close()``, which waits to flush the write buffer:
    with a client that does not read, forever, holding the descriptor.  When the app returns
    with writes still paused (the write deadline passed), or the ping timed out, this resets
    the connection (``SO_LINGER`` 0, so that the kernel does not keep the unsent data either).
    """
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    class StallAborting(WebSocketsSansIOProtocol):
        def _abort_if_stalled(self) -> None:
            if not self.writable.is_set() and not self.disconnected:
                sock = self.transport.get_extra_info("socket")
                if sock is not None:  # a reset: the kernel drops what is unsent rather than keep trying
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.transport.abort()

        async def run_asgi(self) -> None:
            await super().run_asgi()
            self._abort_if_stalled()

        def keepalive_timeout(self) -> None:
            super().keepalive_timeout()
            self._abort_if_stalled()

    return StallAborting
