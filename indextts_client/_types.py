"""Small value types: progress events, health reports, the sidecar's ready facts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Union

from indextts_sidecar.protocol import Ready

__all__ = ["Health", "ProgressCallback", "ProgressEvent", "RestartCallback", "SidecarInfo"]


@dataclass(frozen=True)
class ProgressEvent:
    """A ``progress`` frame of one request.

    ``stage`` is e.g. ``"load"`` (the model is loading; broadcast to every queued
    request) or ``"synthesize"``; ``fraction`` is in [0, 1] or None when unknown.
    """

    stage: str
    fraction: Union[float, None]
    message: str
    request_id: int


#: ``on_progress`` callbacks: a plain function or a coroutine function taking a ProgressEvent.
ProgressCallback = Callable[[ProgressEvent], Union[Awaitable[Any], Any]]

#: ``on_restart(attempt, reason)``: attempt counts restarts from 1; reason is what ended the previous sidecar.
RestartCallback = Callable[[int, BaseException], Union[Awaitable[Any], Any]]


@dataclass(frozen=True)
class Health:
    """The answer to :meth:`Client.ping`.

    ``round_trip`` is seconds from sending ``ping`` to reading ``pong``; ``active`` the
    id of the request the engine runs; ``memory`` holds bytes (``rss``, ``cuda_*``...).
    """

    round_trip: float
    loaded: bool
    queue_depth: int
    active: Union[int, None]
    memory: dict[str, int]
    uptime: float
    dropped_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class SidecarInfo:
    """The facts of the sidecar's ``ready`` frame."""

    protocol: int
    version: str
    engine: str
    pid: int
    max_frame_size: int
    sample_rate: Union[int, None]
    capabilities: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    dropped_options: tuple[str, ...] = ()

    @classmethod
    def from_ready(cls, ready: Ready) -> SidecarInfo:
        return cls(
            protocol=ready.protocol,
            version=ready.version,
            engine=ready.engine,
            pid=ready.pid,
            max_frame_size=ready.max_frame_size,
            sample_rate=ready.sample_rate,
            capabilities=tuple(ready.capabilities),
            options=dict(ready.options),
            dropped_options=tuple(ready.dropped_options),
        )
