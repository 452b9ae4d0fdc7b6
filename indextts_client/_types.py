"""Small value types: progress events, health reports, the sidecar's ready facts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Union

from indextts_sidecar.protocol import Ready
from indextts_sidecar.protocol.engine_info import SpeedControl

if TYPE_CHECKING:
    from ._audio import AudioChunk, WordTiming

__all__ = [
    "Health",
    "LoadInfo",
    "ProgressCallback",
    "ProgressEvent",
    "RestartCallback",
    "ServedStream",
    "SidecarInfo",
]


class ServedStream(Protocol):
    """One streamed request: ``async with stream as chunks: async for chunk in chunks``.

    After it ends: the sidecar's seconds per phase (``timings``), the engine's facts about the
    request (``facts``: ``voice_cache``...), its words (``words``, as ``Audio.words``), and the
    pool member that served it (None for a Client's, or behind Ray).  A Client's, a Pool's and a
    RayClient's ``stream()`` are each one; the service core and ``stream_text`` read them so.
    """

    @property
    def timings(self) -> Mapping[str, float]: ...

    @property
    def facts(self) -> Mapping[str, Any]: ...

    @property
    def words(self) -> tuple[WordTiming, ...]: ...

    @property
    def member_index(self) -> Union[int, None]: ...

    async def __aenter__(self) -> AsyncIterator[AudioChunk]: ...

    async def __aexit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> Union[bool, None]: ...


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
    #: Requests the engine runs at once as one batch at most; 1: one at a time.
    max_batch: int = 1
    capabilities: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    dropped_options: tuple[str, ...] = ()
    #: The engine's speed control, as its ``ready`` says (None: none, or a sidecar too old to say).
    speed: Union[SpeedControl, None] = None

    @classmethod
    def from_ready(cls, ready: Ready) -> SidecarInfo:
        return cls(
            protocol=ready.protocol,
            version=ready.version,
            engine=ready.engine,
            pid=ready.pid,
            max_frame_size=ready.max_frame_size,
            sample_rate=ready.sample_rate,
            max_batch=ready.max_batch,
            capabilities=tuple(ready.capabilities),
            options=dict(ready.options),
            dropped_options=tuple(ready.dropped_options),
            speed=ready.speed,
        )


#: Keys of ``load``'s reply that are seconds per phase.
_TIMING_KEYS = ("queued", "load")


@dataclass(frozen=True, eq=False)
class LoadInfo(Mapping[str, Any]):
    """The answer to :meth:`Client.load`.

    ``loaded`` and ``sample_rate`` (the engine's native rate, now known); ``timings`` the
    seconds per phase (``queued``, and ``load`` when this call loaded the model);
    ``info`` the engine's own facts (for IndexTTS: which flavour, which model version, from
    where).  It is also the read-only map the sidecar sent (``info["sample_rate"]``...),
    as ``load()`` returned before it was typed.
    """

    loaded: bool
    sample_rate: Union[int, None]
    timings: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_reply(cls, raw: Mapping[str, Any]) -> LoadInfo:
        timings = {key: float(raw[key]) for key in _TIMING_KEYS if isinstance(raw.get(key), (int, float))}
        rate = raw.get("sample_rate")
        return cls(
            loaded=bool(raw.get("loaded", False)),
            sample_rate=rate if isinstance(rate, int) else None,
            timings=timings,
            info={k: v for k, v in raw.items() if k not in ("loaded", "sample_rate", *timings)},
            raw=dict(raw),
        )

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)
