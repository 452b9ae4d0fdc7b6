"""Every error the client raises: one base class, flat role-named subclasses.

Each exception carries its facts as attributes (exit code, stderr tail, wire error
code...) as well as in its message.  Constructors take the message positionally and
everything else by keyword with a default, so :func:`copy.copy` works and each waiting
task can be handed its own instance of a shared failure.
"""

from __future__ import annotations

import copy
import signal as _signal
import sys
from typing import Any, Literal, TypeVar, Union

__all__ = [
    "AuthenticationError",
    "BusyError",
    "ClosedError",
    "CrashedError",
    "EngineError",
    "InvalidRequestError",
    "LoadFailedError",
    "ProtocolError",
    "RequestCancelledError",
    "RequestTimeoutError",
    "RestartLimitError",
    "SidecarError",
    "StartError",
    "VersionMismatchError",
]

E = TypeVar("E", bound=BaseException)

#: Which deadline fired: the overall one, or the one that resets on each frame.
Deadline = Literal["timeout", "idle_timeout"]


class SidecarError(Exception):
    """Base class of every error raised by :mod:`indextts_client`."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return self.message


def _with_tail(message: str, stderr_tail: str) -> str:
    if not stderr_tail:
        return message
    return f"{message}\n--- sidecar stderr (last lines) ---\n{stderr_tail.rstrip()}"


def describe_exit(exit_code: Union[int, None], signal: Union[int, None]) -> str:
    """``"exited with code 70"`` / ``"was killed by signal 9 (SIGKILL)"`` / ``"is still running"``."""
    if signal is not None:
        try:
            name = f" ({_signal.Signals(signal).name})"
        except ValueError:
            name = ""
        return f"was killed by signal {signal}{name}"
    if exit_code is not None:
        return f"exited with code {exit_code}"
    return "is still running"


class StartError(SidecarError):
    """The sidecar did not start: spawn failed, it exited before ``ready``, or ``ready`` timed out.

    ``code`` is the wire error code when the sidecar reported the failure itself in an
    ``error`` frame (``unknown_engine``, ``invalid_option``...).
    """

    def __init__(
        self,
        message: str = "",
        *,
        exit_code: Union[int, None] = None,
        signal: Union[int, None] = None,
        stderr_tail: str = "",
        code: Union[str, None] = None,
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.signal = signal
        self.stderr_tail = stderr_tail
        self.code = code

    def __str__(self) -> str:
        return _with_tail(self.message, self.stderr_tail)


class AuthenticationError(StartError):
    """A sidecar on a socket refused the connection's token (or wanted one and none was given).

    Not retried by reconnecting: the same token would be refused again.
    """


class VersionMismatchError(StartError):
    """The sidecar speaks another protocol version than this client."""

    def __init__(
        self,
        message: str = "",
        *,
        expected: int = 0,
        got: Any = None,
        exit_code: Union[int, None] = None,
        signal: Union[int, None] = None,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(message, exit_code=exit_code, signal=signal, stderr_tail=stderr_tail)
        self.expected = expected
        self.got = got


class CrashedError(SidecarError):
    """The sidecar died (or its stream ended) while requests were pending.

    ``exit_code`` is set when it exited, ``signal`` when a signal killed it; both are
    None when the stream ended without an exit (a non-process transport).
    """

    def __init__(
        self,
        message: str = "",
        *,
        exit_code: Union[int, None] = None,
        signal: Union[int, None] = None,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.signal = signal
        self.stderr_tail = stderr_tail

    def __str__(self) -> str:
        return _with_tail(self.message, self.stderr_tail)


class RestartLimitError(SidecarError):
    """The sidecar failed more often than the restart budget allows; the client is dead.

    ``last_error`` is the failure that exhausted the budget (also the ``__cause__``).
    """

    def __init__(
        self,
        message: str = "",
        *,
        max_restarts: int = 0,
        restart_window: float = 0.0,
        last_error: Union[BaseException, None] = None,
    ) -> None:
        super().__init__(message)
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.last_error = last_error


class RequestTimeoutError(SidecarError, TimeoutError):
    """A request's deadline fired; the request was cancelled, the sidecar lives on.

    ``deadline`` is ``"timeout"`` (the overall limit) or ``"idle_timeout"`` (no progress
    or audio frame for that long); ``seconds`` is the limit that fired.
    """

    def __init__(
        self,
        message: str = "",
        *,
        deadline: Deadline = "timeout",
        seconds: float = 0.0,
        request_id: Union[int, None] = None,
    ) -> None:
        super().__init__(message)
        self.deadline: Deadline = deadline
        self.seconds = seconds
        self.request_id = request_id

    def __str__(self) -> str:
        return self.message


class RequestCancelledError(SidecarError):
    """The sidecar ended the request without being asked by this caller (``shutting_down``...)."""

    def __init__(self, message: str = "", *, code: str = "cancelled", request_id: Union[int, None] = None) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


class EngineError(SidecarError):
    """The sidecar answered a request with an ``error`` frame.

    ``code`` is the wire error code, ``retryable`` says whether the same request may
    succeed later, ``detail`` holds the frame's detail map (``field``, ``traceback``...).
    """

    def __init__(
        self,
        message: str = "",
        *,
        code: str = "engine_error",
        retryable: bool = False,
        detail: Union[dict[str, Any], None] = None,
        request_id: Union[int, None] = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable
        self.detail: dict[str, Any] = dict(detail or {})
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class BusyError(EngineError):
    """The sidecar's queue is full (``busy``); retry later."""


class LoadFailedError(EngineError):
    """The model failed to load (``load_failed``); the next request tries again."""


class InvalidRequestError(EngineError):
    """The request was rejected as given: ``invalid_option``, ``unknown_option``, ``invalid_input``..."""


class ProtocolError(SidecarError):
    """The sidecar broke protocol v1 (undecodable frame, missing audio, lost framing)."""

    def __init__(self, message: str = "", *, stderr_tail: str = "") -> None:
        super().__init__(message)
        self.stderr_tail = stderr_tail

    def __str__(self) -> str:
        return _with_tail(self.message, self.stderr_tail)


class ClosedError(SidecarError):
    """The client or connection is closed (or closing)."""


class BufferFullError(SidecarError):
    """A stream's consumer fell too far behind: more audio than ``max_buffered`` bytes waited.

    The request was cancelled on the sidecar; other requests are unaffected.
    """

    def __init__(self, message: str = "", *, request_id: Union[int, None] = None, limit: int = 0) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.limit = limit


class UnreadError(ClosedError):
    """The sidecar stopped without reading this request; a client sends it to a new sidecar."""


_INVALID_CODES = frozenset(
    {"invalid_option", "unknown_option", "invalid_input", "invalid_message", "unknown_op", "duplicate_id"}
    | {"unsupported"}  # what the engine cannot do (an emotion it has no capability for)
)


def error_for_frame(
    code: str, message: str, *, request_id: Union[int, None], retryable: bool, detail: dict[str, Any]
) -> SidecarError:
    """The exception for a request's terminal ``error`` frame."""
    if code in ("cancelled", "shutting_down"):
        return RequestCancelledError(message, code=code, request_id=request_id)
    cls: type[EngineError] = EngineError
    if code == "busy":
        cls = BusyError
    elif code == "load_failed":
        cls = LoadFailedError
    elif code in _INVALID_CODES:
        cls = InvalidRequestError
    return cls(message, code=code, retryable=retryable, detail=detail, request_id=request_id)


def fresh(exc: E) -> E:
    """A new instance of ``exc`` with the same attributes, for raising in another task."""
    try:
        return copy.copy(exc)
    except Exception:  # pragma: no cover - every exception above copies
        return exc


if sys.version_info >= (3, 11):
    _BaseExceptionGroup = BaseExceptionGroup  # noqa: F821 - a builtin since 3.11
else:  # pragma: no cover - Python 3.10
    from exceptiongroup import BaseExceptionGroup as _BaseExceptionGroup  # type: ignore[import-not-found,unused-ignore]


def unwrap(exc: BaseException) -> BaseException:
    """The single leaf of nested exception groups (the public API never raises a group)."""
    while isinstance(exc, _BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
