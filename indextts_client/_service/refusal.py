"""One neutral refusal, and the one table from a client error to it.

A front end renders a :class:`Refusal` (HTTP's OpenAI error JSON and status, the WebSocket's
``error`` event, Wyoming's ``error`` event); it never decides again what a failure means.
Nothing here puts a server path or a traceback in a message: the log gets those.
"""

from __future__ import annotations

import enum
import logging
import re
from typing import Union

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

__all__ = ["MAX_MESSAGE", "Kind", "Refusal", "refusal_of", "without_paths"]

log = logging.getLogger("indextts_client.service")

#: Longest message a refusal carries; a longer one is cut (the log has it whole).
MAX_MESSAGE = 300


class Kind(enum.Enum):
    """What went wrong, in words every front end maps to its own (HTTP: the status in brackets)."""

    INVALID = "invalid"  # the request is wrong (400)
    UNAUTHORIZED = "unauthorized"  # no key or a wrong one (401)
    FORBIDDEN = "forbidden"  # a foreign Origin or Host (403)
    NOT_FOUND = "not_found"  # no such thing (404)
    CONFLICT = "conflict"  # the name is taken (409)
    TOO_LARGE = "too_large"  # over a size bound (413)
    UNSUPPORTED_MEDIA = "unsupported_media"  # the wrong content type (415)
    BUSY = "busy"  # every sidecar is busy: try again (429)
    ENGINE = "engine"  # the engine failed (500)
    INTERNAL = "internal"  # anything else (500)
    STARTING = "starting"  # the backend is not up yet (503, Retry-After)
    OVERLOADED = "overloaded"  # a server bound is reached: try again (503, Retry-After)
    UNAVAILABLE = "unavailable"  # no sidecar can serve (503)
    TIMEOUT = "timeout"  # the request took too long (504)
    SLOW = "slow"  # the client took too long to send (408)


class Refusal(Exception):
    """A request that is not served: its kind, a short message, the field at fault, a code.

    ``code`` is the machine-readable word (``unknown_voice``, ``busy``...); it defaults to
    OpenAI's ``invalid_request_error`` (``server_error`` for ENGINE and INTERNAL).  ``param``
    names the request field at fault (``voice``, ``options.rate``).
    """

    def __init__(
        self, kind: Kind, message: str, *, param: Union[str, None] = None, code: Union[str, None] = None
    ) -> None:
        message = without_paths(message)
        message = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
        super().__init__(message)
        self.kind, self.message, self.param = kind, message, param
        self.code = code or ("server_error" if kind in (Kind.ENGINE, Kind.INTERNAL) else "invalid_request_error")

    def __repr__(self) -> str:
        return f"Refusal({self.kind.value}, {self.message!r}, param={self.param!r}, code={self.code!r})"


#: An absolute path (POSIX or Windows), quoted or not; a quoted one may hold spaces.
_QUOTED_PATH = re.compile(r"""(['"])(?:/|[A-Za-z]:\\)[^'"]*\1""")
_BARE_PATH = re.compile(r"""(?<![\w.:/])/(?:[^\s'"/]+/)+[^\s'",;)]*""")


def without_paths(message: str) -> str:
    """``message`` with every absolute path replaced by ``<path>``: a server's layout is not the client's business."""
    message = _QUOTED_PATH.sub(lambda m: f"{m.group(1)}<path>{m.group(1)}", message)
    return _BARE_PATH.sub("<path>", message)


def _param(field: object) -> Union[str, None]:
    """The request field an engine's ``$.options.rate`` names: ``options.rate``, as the request spells it."""
    if not isinstance(field, str) or not field:
        return None
    return field.removeprefix("$.") or None


def refusal_of(exc: SidecarError) -> Refusal:
    """The refusal for a client error; the whole error (with any stderr tail) goes to the log."""
    name = type(exc).__name__
    if isinstance(exc, InvalidRequestError):
        return Refusal(Kind.INVALID, exc.message, param=_param(exc.detail.get("field")), code=exc.code)
    if isinstance(exc, BusyError):
        return Refusal(Kind.BUSY, "every sidecar is busy; try again", code="busy")
    if isinstance(exc, RequestTimeoutError):
        return Refusal(Kind.TIMEOUT, "the request timed out", code="timeout")
    log.warning("request failed: %s: %s", name, exc)
    if isinstance(exc, (StartError, RestartLimitError, ClosedError, CrashedError)):
        return Refusal(Kind.UNAVAILABLE, f"no sidecar can serve the request ({name})", code="unavailable")
    if isinstance(exc, EngineError):
        return Refusal(Kind.ENGINE, f"{name}: {exc.message}", code=exc.code)
    return Refusal(Kind.INTERNAL, f"the request failed ({name})", code="server_error")
