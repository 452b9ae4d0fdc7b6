"""Bounds on what one client can make the server hold: body size and time, requests in flight,
and (for uvicorn's h11 protocol) the time to send a request's head."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any, Union

import anyio
import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from ._errors import HTTPError

__all__ = ["Limits", "LimitsMiddleware", "header_deadline_protocol"]

_CLOSE = {"Connection": "close"}


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
    ) -> None:
        for name, value in (
            ("max_body", max_body),
            ("max_upload", max_upload),
            ("max_input", max_input),
            ("body_timeout", body_timeout),
            ("max_in_flight", max_in_flight),
        ):
            if not value > 0:
                raise ValueError(f"Limits.{name} must be positive, not {value!r}")
        self.max_body, self.max_upload, self.max_input = max_body, max_upload, max_input
        self.body_timeout, self.max_in_flight = body_timeout, max_in_flight


class LimitsMiddleware:
    """Refuses a body over its route's limit (413, by ``Content-Length`` or while reading, so
    the body is never in memory), a body slower than ``body_timeout`` (408), and requests
    past ``max_in_flight`` (503, at once: waiting would hold a descriptor).

    Errors raised from ``receive`` reach Starlette's exception handlers as ``HTTPError``.
    """

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app, self.limits = app, limits
        self.in_flight = 0

    def _limit(self, scope: Scope) -> int:
        uploads = scope["path"].startswith("/v1/audio/voices")
        return self.limits.max_upload if uploads else self.limits.max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope)
        declared = _content_length(scope)
        refusal = None
        if declared is not None and declared > limit:
            refusal = _too_large(limit)
        elif self.in_flight >= self.limits.max_in_flight:
            refusal = HTTPError(
                503, "the server has too many requests in flight", code="overloaded", headers={"Retry-After": "1"}
            )
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, _bounded(receive, limit, self.limits.body_timeout), send)
        finally:
            self.in_flight -= 1


def _too_large(limit: int) -> HTTPError:
    # Connection: close, for the rest of the body is not read.
    return HTTPError(
        413, f"the body is over this route's limit of {limit} bytes", code="body_too_large", headers=_CLOSE
    )


def _content_length(scope: Scope) -> Union[int, None]:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _bounded(receive: Receive, limit: int, timeout: float) -> Receive:
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
            raise HTTPError(408, f"the body took over {timeout:g} s to arrive", code="body_timeout", headers=_CLOSE)
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise _too_large(limit)
            whole = not message.get("more_body", False)
        return message

    return bounded_receive


def _no_delay(transport: Any) -> None:
    """TCP_NODELAY: asyncio sets it only on sockets made with proto=IPPROTO_TCP, and a listening
    socket handed over (``--fd``, or bound by a caller) may not be.  Without it a response's
    head and body wait on the client's delayed ACK: 40 ms a request."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def header_deadline_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol that closes a connection whose request head has not arrived
    within ``seconds`` of the connection (or of the previous response): uvicorn has a
    keep-alive timeout but no deadline for the head itself."""

    class HeaderDeadline(H11Protocol):
        _deadline: Union[asyncio.TimerHandle, None] = None

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(seconds, self._expired)

        def _expired(self) -> None:
            self._deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
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
