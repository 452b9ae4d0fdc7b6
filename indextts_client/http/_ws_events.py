"""The WebSocket route's events and bounds: what a client sends, decoded and checked, and
uvicorn's WebSocket protocol with a bound on what a client that does not read can make it hold.

The settings events are the service's shared fields (:class:`SpeechFields`) plus their own.
An event nesting deeper than :data:`MAX_DEPTH` is refused before it is decoded, like any
malformed event: an ``error`` event, and the connection stays open.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Union

import msgspec

from .._service import Refusal, SpeechFields, check_depth
from ._limits import WriteStall, reset
from ._schema import param_of

__all__ = [
    "CONTEXT_ID",
    "ClientEvent",
    "ContextCancel",
    "ContextConfig",
    "EventError",
    "Fatal",
    "InputDone",
    "InputFlush",
    "InputText",
    "SessionConfig",
    "WebSocketLimits",
    "decode_event",
    "log_reset",
    "stall_aborting_protocol",
]

log = logging.getLogger("indextts_client.http")

#: Close codes (RFC 6455 section 7.4.1).
NORMAL, POLICY, TOO_BIG, TRY_LATER = 1000, 1008, 1009, 1013
CONTEXT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(frozen=True)
class WebSocketLimits:
    """What one WebSocket client may make the server hold or wait for (``serve`` flags in brackets)."""

    #: Connections with the key on the route at once; one more is refused with 503 [--ws-max-connections].
    max_connections: int = 64
    #: Connections that have not yet shown the key (in ``session.config``): their own budget,
    #: so that they never take a slot of a client with the key [--ws-max-unauthenticated].
    max_unauthenticated: int = 8
    #: Seconds a connection has to show the key before it is closed [--ws-auth-timeout].
    auth_timeout: float = 5.0
    #: Contexts open at once on one connection [--ws-max-contexts].
    max_contexts: int = 8
    #: Bytes of one message from the client, text or binary [--ws-max-message].
    max_message: int = 64 * 1024
    #: Characters of one context's text received and not yet taken by its sentence splitter
    #: (which holds at most ``lookahead + 2`` sentences more) [--ws-max-pending-chars].
    max_pending_chars: int = 16 * 1024
    #: Seconds without a client message or an audio frame before the connection is closed [--ws-idle-timeout].
    idle_timeout: float = 60.0
    #: Seconds one frame (or the pongs, the close) may take to reach a client that does not
    #: read; past it the connection's contexts are cancelled and it is reset [--ws-write-timeout].
    write_timeout: float = 10.0

    def __post_init__(self) -> None:
        counts = ("max_connections", "max_unauthenticated", "max_contexts", "max_message", "max_pending_chars")
        for name in counts:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"WebSocketLimits.{name} must be a positive int, not {value!r}")
        for name in ("auth_timeout", "idle_timeout", "write_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"WebSocketLimits.{name} must be positive")

    @property
    def max_unsent(self) -> int:
        """Bytes the server queues for a client before it is reset without waiting for the
        write deadline: what a client that sends pings and never reads grows (their pongs)."""
        return max(4 * self.max_message, 1024 * 1024)


class SessionConfig(SpeechFields, tag="session.config", tag_field="type", kw_only=True, frozen=True):
    """The connection's defaults for the contexts it opens later, and the API key."""

    api_key: Union[str, None] = None


class ContextConfig(SpeechFields, tag="context.config", tag_field="type", kw_only=True, frozen=True):
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


class EventError(Exception):
    """A client event that is refused: an ``error`` event, the connection stays open."""

    def __init__(
        self, code: str, message: str, context_id: Union[str, None] = None, param: Union[str, None] = None
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.context_id, self.param = code, message, context_id, param

    @classmethod
    def of(cls, refusal: Refusal, context_id: Union[str, None] = None) -> EventError:
        return cls(refusal.code, refusal.message, context_id, refusal.param)


class Fatal(Exception):
    """The connection ends: an ``error`` event (when it can still be sent), then this close code."""

    def __init__(self, close: int, code: str, message: str) -> None:
        super().__init__(message)
        self.close, self.code, self.message = close, code, message


def decode_event(text: str) -> ClientEvent:
    """One client event; :class:`EventError` (``invalid_event``, or ``too_deep``) when it is none."""
    try:
        check_depth(text)
    except Refusal as refusal:
        raise EventError.of(refusal) from None
    try:
        return _decoder.decode(text)
    except msgspec.ValidationError as exc:
        raise EventError("invalid_event", f"invalid event: {exc}", param=param_of(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise EventError("invalid_event", f"an event is one JSON object: {exc}") from None


def log_reset(scope: MutableMapping[str, Any], reason: str) -> None:
    """Log why a connection that stopped reading is dropped, once: the app's write deadline
    and the protocol's stall timer (a pong, a close frame) race for the same connection."""
    if not scope.get("indextts.reset_logged"):
        scope["indextts.reset_logged"] = True
        log.warning("websocket reset: %s", reason)


def stall_aborting_protocol(limits: Union[WebSocketLimits, None] = None) -> type[asyncio.Protocol]:
    """uvicorn's WebSocket protocol (on the ``websockets`` package) that resets a connection whose
    client has stopped reading:

    - once the app is done with it, or a keepalive ping went unanswered, with writes paused
      (uvicorn would ``transport.close()``, which waits to flush: forever);
    - once writes have stayed paused ``write_timeout`` seconds, whatever is being written
      (the pongs of a client that pings and never reads are written by the protocol, not the app);
    - at once when more than :attr:`WebSocketLimits.max_unsent` bytes wait for the client.
    """
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    bounds = limits or WebSocketLimits()

    class StallAborting(WriteStall, WebSocketsSansIOProtocol):
        _write_timeout = bounds.write_timeout

        def _write_stalled(self) -> None:
            self._abort_if_stalled()

        def _abort_if_stalled(self) -> None:
            if not self.writable.is_set() and not self.disconnected:
                self._reset(f"the client read nothing for {bounds.write_timeout:g} s")

        def _check_unsent(self) -> None:
            if not self.disconnected and self.transport.get_write_buffer_size() > bounds.max_unsent:
                self._reset(f"over {bounds.max_unsent} bytes wait for the client")

        def _reset(self, reason: str) -> None:
            scope: Union[MutableMapping[str, Any], None] = getattr(self, "scope", None)
            if scope is not None:  # none before the handshake: that is uvicorn's, unlogged
                log_reset(scope, reason)
            reset(self.transport)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._check_unsent()  # the pongs (and close frames) written in answer to this data

        async def run_asgi(self) -> None:
            await super().run_asgi()
            self._abort_if_stalled()

        def keepalive_timeout(self) -> None:
            super().keepalive_timeout()
            self._abort_if_stalled()

    return StallAborting
