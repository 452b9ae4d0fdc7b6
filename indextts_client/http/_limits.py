"""Bounds on what one client can make the server hold: body size and time, requests in flight
(authorized ones and the others apart; ``/health``, ``/metrics`` and the playground never
count), and for uvicorn's h11 protocol the time to send a request's head and to take a
response's bytes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Union

import anyio
import h11
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from .._defaults import DEFAULT_MAX_SILENCE
from .._service import Kind, Refusal, check_max_silence
from ._errors import HTTPError

__all__ = ["UNCOUNTED", "Limits", "LimitsMiddleware", "WriteStall", "header_deadline_protocol", "reset"]

_CLOSE = {"Connection": "close"}


#: Routes that are never refused for load: a probe must see the server as it is.
UNCOUNTED = frozenset({"/health", "/metrics", "/"})


class Limits:
    """The app's bounds; each is a flag of ``serve`` and a row of docs/reliability.md."""

    def __init__(
        self,
        *,
        max_body: int = 64 * 1024,
        max_upload: int = 10 * 2**20 + 64 * 1024,
        max_input: int = 4096,
        body_timeout: float = 30.0,
        max_in_flight: int = 64,
        max_unauthorized: int = 16,
        max_silence: float = DEFAULT_MAX_SILENCE,
    ) -> None:
        for name, value in (
            ("max_body", max_body),
            ("max_upload", max_upload),
            ("max_input", max_input),
            ("body_timeout", body_timeout),
            ("max_in_flight", max_in_flight),
            ("max_unauthorized", max_unauthorized),
        ):
            if not value > 0:
                raise ValueError(f"Limits.{name} must be positive, not {value!r}")
        self.max_body, self.max_upload, self.max_input = max_body, max_upload, max_input
        self.body_timeout, self.max_in_flight = body_timeout, max_in_flight
        #: Requests without the key (on a server with one) in flight at once: they have their
        #: own budget, so that they never take a slot from a client with the key.
        self.max_unauthorized = max_unauthorized
        #: Seconds the breaks of one SSML request (a WebSocket sentence) may add up to.
        self.max_silence = check_max_silence(max_silence)


def _overloaded(what: str) -> HTTPError:
    return HTTPError(Refusal(Kind.OVERLOADED, f"the server has too many {what} in flight", code="overloaded"))


class LimitsMiddleware:
    """Refuses a body over its route's limit (413, by ``Content-Length`` or while reading, so
    the body is never in memory), a body slower than ``body_timeout`` (408), and requests
    past ``max_in_flight`` (503, at once: waiting would hold a descriptor).  A request that
    is not authorized counts against ``max_unauthorized`` instead; ``/health``, ``/metrics``
    and ``/`` count against nothing.

    Errors raised from ``receive`` reach Starlette's exception handlers as ``HTTPError``.
    """

    def __init__(self, app: ASGIApp, limits: Limits, authorized: Callable[[HTTPConnection], bool]) -> None:
        self.app, self.limits, self.authorized = app, limits, authorized
        self.in_flight = 0
        self.unauthorized = 0

    def _limit(self, scope: Scope) -> tuple[int, Union[str, None]]:
        """The route's body limit, and the field a body over it is said to be at fault."""
        if scope["path"].startswith("/v1/audio/voices"):
            return self.limits.max_upload, "audio_sample"  # what makes an upload large
        return self.limits.max_body, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED:
            await self.app(scope, receive, send)
            return
        limit, param = self._limit(scope)
        declared = _content_length(scope)
        authorized = self.authorized(HTTPConnection(scope))
        refusal = None
        if declared is not None and declared > limit:
            refusal = _too_large(limit, param)
        elif authorized and self.in_flight >= self.limits.max_in_flight:
            refusal = _overloaded("requests")
        elif not authorized and self.unauthorized >= self.limits.max_unauthorized:
            refusal = _overloaded("requests without the key")
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            return
        if authorized:
            self.in_flight += 1
        else:
            self.unauthorized += 1
        try:
            await self.app(scope, _bounded(receive, limit, param, self.limits.body_timeout), send)
        finally:
            if authorized:
                self.in_flight -= 1
            else:
                self.unauthorized -= 1


def _too_large(limit: int, param: Union[str, None]) -> HTTPError:
    # Connection: close, for the rest of the body is not read.
    message = f"the body is over this route's limit of {limit} bytes"
    return HTTPError(Refusal(Kind.TOO_LARGE, message, param=param, code="body_too_large"), headers=_CLOSE)


def _content_length(scope: Scope) -> Union[int, None]:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _bounded(receive: Receive, limit: int, param: Union[str, None], timeout: float) -> Receive:
    received = 0
    deadline: Union[float, None] = None
    whole = False

    async def bounded_receive() -> Message:
        nonlocal received, deadline, whole
        if whole:  # the body is in: what is left to hear is a disconnect, however late
            return await receive()
        if deadline is None:
            deadline = anyio.current_time() + timeout
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as scope:
            message = await receive()
        if scope.cancelled_caught:
            refusal = Refusal(Kind.SLOW, f"the body took over {timeout:g} s to arrive", code="body_timeout")
            raise HTTPError(refusal, headers=_CLOSE)
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise _too_large(limit, param)
            whole = not message.get("more_body", False)
        return message

    return bounded_receive


def _no_delay(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY: asyncio sets it only on sockets made with proto=IPPROTO_TCP, and a listening
    socket handed over (``--fd``, or bound by a caller) may not be.  Without it a response's
    head and body wait on the client's delayed ACK: 40 ms a request."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def reset(transport: asyncio.Transport) -> None:
    """Drop a connection now: a reset (``SO_LINGER`` 0), so that neither asyncio nor the kernel
    keeps trying to deliver what a client that stopped reading never takes."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class WriteStall(asyncio.Protocol):
    """The one write-stall timer of the server's protocols (a base before uvicorn's protocol):
    writes that stay paused ``_write_timeout`` seconds (None: no bound) call ``_write_stalled``;
    resumed writes or a lost connection disarm it."""

    _write_timeout: Union[float, None] = None
    _stall: Union[asyncio.TimerHandle, None] = None

    def _write_stalled(self) -> None:
        raise NotImplementedError

    def _disarm_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timeout is not None and self._stall is None:
            self._stall = asyncio.get_running_loop().call_later(self._write_timeout, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_stall()

    def connection_lost(self, exc: Union[Exception, None]) -> None:
        self._disarm_stall()
        super().connection_lost(exc)


def header_deadline_protocol(seconds: float, write_timeout: Union[float, None] = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol that closes a connection whose request head has not arrived
    within ``seconds`` of the connection (or of the previous response): uvicorn has a
    keep-alive timeout but no deadline for the head itself.  With ``write_timeout``, a
    response whose client takes no bytes for that long (writes stay paused) is reset: the
    app sees a disconnect, which ends its stream and cancels the work on the sidecar."""

    class HeaderDeadline(WriteStall, H11Protocol):
        _deadline: Union[asyncio.TimerHandle, None] = None
        _write_timeout = write_timeout

        def _write_stalled(self) -> None:
            reset(self.transport)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(seconds, self._expired)

        def _expired(self) -> None:
            self._deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as H11Protocol
            super().connection_made(transport)
            _no_delay(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Union[Exception, None]) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            super().connection_lost(exc)

    return HeaderDeadline
