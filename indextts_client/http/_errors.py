"""OpenAI's error JSON for every answer that is not audio: a :class:`Refusal` rendered.

The service core decides what a failure means (:mod:`indextts_client._service.refusal`);
this module only gives each kind its status and OpenAI's ``type``.  An API client sees an
error's class and a short message; the server's log gets the rest (stderr tails,
tracebacks).  Nothing here puts a server path or a traceback in a body.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Union

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import HTTPExceptionHandler

from .._exceptions import SidecarError
from .._service import Kind, Refusal, refusal_of

__all__ = ["RETRY", "STATUS", "HTTPError", "error_for", "exception_handlers"]

log = logging.getLogger("indextts_client.http")

#: Each kind's status.
STATUS = {
    Kind.INVALID: 400,
    Kind.UNAUTHORIZED: 401,
    Kind.FORBIDDEN: 403,
    Kind.NOT_FOUND: 404,
    Kind.SLOW: 408,
    Kind.CONFLICT: 409,
    Kind.TOO_LARGE: 413,
    Kind.UNSUPPORTED_MEDIA: 415,
    Kind.BUSY: 429,
    Kind.ENGINE: 500,
    Kind.INTERNAL: 500,
    Kind.STARTING: 503,
    Kind.OVERLOADED: 503,
    Kind.UNAVAILABLE: 503,
    Kind.TIMEOUT: 504,
}
_KIND_OF_STATUS = {400: Kind.INVALID, 401: Kind.UNAUTHORIZED, 403: Kind.FORBIDDEN, 404: Kind.NOT_FOUND}
_KIND_OF_STATUS.update({405: Kind.INVALID, 408: Kind.SLOW, 413: Kind.TOO_LARGE, 415: Kind.UNSUPPORTED_MEDIA})
#: OpenAI's error ``type`` for the kinds that have their own.
_TYPES = {Kind.BUSY: "rate_limit_error", Kind.TIMEOUT: "timeout_error"}
#: Kinds a client should try again after a second.
RETRY = {"Retry-After": "1"}
_RETRIED = frozenset({Kind.STARTING, Kind.OVERLOADED})


class HTTPError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self, refusal: Refusal, *, status: Union[int, None] = None, headers: Union[Mapping[str, str], None] = None
    ) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal
        self.status = status or STATUS[refusal.kind]
        self.message, self.param, self.code = refusal.message, refusal.param, refusal.code
        self.kind = _TYPES.get(refusal.kind, "invalid_request_error" if self.status < 500 else "server_error")
        retry = RETRY if refusal.kind in _RETRIED else {}
        self.headers = {**retry, **(headers or {})} or None

    def body(self) -> dict[str, dict[str, Union[str, None]]]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_for(exc: SidecarError) -> HTTPError:
    """The answer for a speech request's client error; the whole error (with any stderr tail) goes
    to the log.  The text the client and the sidecar call ``text`` is this request's ``input``."""
    refusal = refusal_of(exc)
    if refusal.param == "text":
        refusal = Refusal(refusal.kind, refusal.message, param="input", code=refusal.code)
    return HTTPError(refusal)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    messages = {404: "no such route", 405: "method not allowed on this route"}
    message = messages.get(exc.status_code, str(exc.detail))
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    kind = _KIND_OF_STATUS.get(exc.status_code, Kind.INVALID if exc.status_code < 500 else Kind.INTERNAL)
    headers = dict(exc.headers) if exc.headers else None
    return HTTPError(Refusal(kind, message, code=code), status=exc.status_code, headers=headers).response()


async def _refused(request: Request, exc: Exception) -> Response:
    if isinstance(exc, Refusal):
        return HTTPError(exc).response()
    assert isinstance(exc, HTTPError)
    return exc.response()


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Starlette logs nothing itself here; uvicorn logs the traceback after this answer.
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return HTTPError(Refusal(Kind.INTERNAL, f"internal error ({type(exc).__name__})", code="server_error")).response()


def exception_handlers() -> dict[type[Exception], HTTPExceptionHandler]:
    return {HTTPException: _http_exception, HTTPError: _refused, Refusal: _refused, Exception: _unexpected}
