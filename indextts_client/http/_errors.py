"""OpenAI's error JSON for every answer that is not audio, and the mapping from client errors.

An API client sees an error's class and a short message; the server's log gets the rest
(stderr tails, tracebacks).  Nothing here puts a server path or a traceback in a body.
"""

from __future__ import annotations

import logging
from typing import Any, Union

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._exceptions import (
    BusyError,
    ClosedError,
    CrashedError,
    EngineError,
    InvalidRequestError,
    RequestTimeoutError,
    RestartLimitError,
    SidecarError,
    StartError,
)

__all__ = ["HTTPError", "error_for", "exception_handlers"]

log = logging.getLogger("indextts_client.http")

#: Longest message an error body carries; a longer one is cut (the log has it whole).
MAX_MESSAGE = 300

_KINDS = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error"}


class HTTPError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: Union[str, None] = None,
        param: Union[str, None] = None,
        code: Union[str, None] = None,
        headers: Union[dict[str, str], None] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
        default_kind = _KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.kind = kind or default_kind
        self.param = param
        self.code = code or self.kind
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _param(field: object) -> Union[str, None]:
    """The request field an engine's ``$.options.rate`` names, as OpenAI's ``param``."""
    if not isinstance(field, str) or not field:
        return None
    return field.removeprefix("$.").removeprefix("options.") or None


def error_for(exc: SidecarError) -> HTTPError:
    """The answer for a client error; the whole error (with any stderr tail) goes to the log."""
    name = type(exc).__name__
    if isinstance(exc, InvalidRequestError):
        return HTTPError(400, exc.message, param=_param(exc.detail.get("field")), code=exc.code)
    if isinstance(exc, BusyError):
        return HTTPError(429, "every sidecar is busy; try again", kind="rate_limit_error", code="busy")
    if isinstance(exc, RequestTimeoutError):
        return HTTPError(504, "the request timed out", kind="timeout_error", code="timeout")
    log.warning("request failed: %s: %s", name, exc)
    if isinstance(exc, (StartError, RestartLimitError, ClosedError, CrashedError)):
        return HTTPError(503, f"no sidecar can serve the request ({name})", code="unavailable")
    if isinstance(exc, EngineError):
        return HTTPError(500, f"{name}: {exc.message}", code=exc.code)
    return HTTPError(500, f"the request failed ({name})", code="server_error")


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    messages = {404: "no such route", 405: "method not allowed on this route"}
    message = messages.get(exc.status_code, str(exc.detail))
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    headers = dict(exc.headers) if exc.headers else None
    return HTTPError(exc.status_code, message, code=code, headers=headers).response()


async def _ours(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPError)
    return exc.response()


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Starlette logs nothing itself here; uvicorn logs the traceback after this answer.
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return HTTPError(500, f"internal error ({type(exc).__name__})", code="server_error").response()


def exception_handlers() -> dict[Any, Any]:
    return {HTTPException: _http_exception, HTTPError: _ours, Exception: _unexpected}
