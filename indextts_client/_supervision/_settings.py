"""The settings of a client's sidecars: validated once, fixed for the client's lifetime.

:class:`~indextts_client.Client` builds one :class:`SidecarSettings` from its arguments
(how to reach the sidecar is the transport's, in ``_transports.py``); the supervisor reads
its restart budget, heartbeat and stop grace from it and hands each new
:class:`~indextts_client._wire._connection.Connection` the part that is the connection's.
"""

from __future__ import annotations

import dataclasses
from typing import Union

from .._defaults import (
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_HEARTBEAT_MISSES,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BUFFERED,
    DEFAULT_MAX_RESTART_BACKOFF,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_READY_TIMEOUT,
    DEFAULT_RESTART_BACKOFF,
    DEFAULT_RESTART_WINDOW,
    DEFAULT_SHUTDOWN_TIMEOUT,
)
from .._types import RestartCallback
from ._process import Redactor
from ._restarts import RestartBudget

__all__ = ["SidecarSettings"]


@dataclasses.dataclass(frozen=True)
class SidecarSettings:
    """What every sidecar session of one client shares; the meaning of each is :class:`Client`'s."""

    #: Blanks secrets out of stderr lines, logs and error messages.
    redact: Redactor = dataclasses.field(default_factory=lambda: Redactor({}))
    ready_timeout: Union[float, None] = DEFAULT_READY_TIMEOUT
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    timeout: Union[float, None] = None
    idle_timeout: Union[float, None] = DEFAULT_IDLE_TIMEOUT
    frame_timeout: Union[float, None] = DEFAULT_FRAME_TIMEOUT
    max_buffered: int = DEFAULT_MAX_BUFFERED
    #: The shared secret a listening sidecar's challenge is answered with.
    token: Union[str, bytes, None] = None
    max_restarts: int = DEFAULT_MAX_RESTARTS
    restart_window: float = DEFAULT_RESTART_WINDOW
    restart_backoff: float = DEFAULT_RESTART_BACKOFF
    max_restart_backoff: float = DEFAULT_MAX_RESTART_BACKOFF
    on_restart: Union[RestartCallback, None] = None
    heartbeat: Union[float, None] = None
    heartbeat_misses: int = DEFAULT_HEARTBEAT_MISSES

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if self.heartbeat is not None and not self.heartbeat > 0:
            raise ValueError("heartbeat must be > 0 seconds or None")
        if self.heartbeat_misses < 1:
            raise ValueError("heartbeat_misses must be >= 1")

    def restart_budget(self) -> RestartBudget:
        """A fresh budget of automatic restarts (one per client)."""
        return RestartBudget(
            max_restarts=self.max_restarts,
            window=self.restart_window,
            backoff=self.restart_backoff,
            max_backoff=self.max_restart_backoff,
        )
