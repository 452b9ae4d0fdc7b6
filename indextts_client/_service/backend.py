"""What the service serves from: a local :class:`Pool`, or a Ray Serve deployment.

:class:`Backend` is the one seam a front end talks to: ``stream(text, prepared)`` answers a
:class:`ServedStream` (an async context manager of :class:`AudioChunk`, whose sidecar timings,
engine facts and member are declared attributes, read after it ends), ``stream_text(texts,
prepared)`` a :class:`TextStream`, and ``health()`` one :class:`HealthReport`.  The engine's
facts (:class:`EngineFacts`) come from what the sidecar says: its ``ready`` frame (name,
capabilities, speed control) and its ``voices`` answer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

import msgspec

from indextts_sidecar.protocol.engine_info import SpeedControl

from .._client import Client
from .._exceptions import SidecarError
from .._pool._pool import Pool
from .._stream_text import TextInput, TextStream
from .._types import ProgressCallback, ServedStream, SidecarInfo
from .facts import EngineFacts, EngineVoice
from .prepare import Prepared

__all__ = [
    "Backend",
    "HealthReport",
    "MemberReport",
    "PoolBackend",
    "RayBackend",
    "RayLike",
    "ReplicaInfo",
    "ReplicaPing",
    "ServedStream",
]

log = logging.getLogger("indextts_client.service")


@dataclass(frozen=True)
class MemberReport:
    """One pool member's state, for ``/health`` (with the key) and the metrics."""

    index: int
    state: str
    outstanding: int
    served: int
    restarts: int
    pid: Union[int, None]
    device: Union[str, None]
    #: The class of the member's last error, never its text (which may hold paths).
    error: Union[str, None]


@dataclass(frozen=True)
class HealthReport:
    """``ok`` when some member (or the deployment) answers, else ``unavailable``."""

    ok: bool
    members: tuple[MemberReport, ...] = ()
    #: Behind Ray: the replica's answer to a ping.
    replica: Mapping[str, Any] = field(default_factory=dict)
    #: Why it is unavailable (an exception's class), when it is.
    error: Union[str, None] = None


class Backend(Protocol):
    """What a front end serves from."""

    @property
    def facts(self) -> EngineFacts: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def stream(
        self, text: str, prepared: Prepared, *, on_progress: Union[ProgressCallback, None] = None
    ) -> ServedStream: ...

    def stream_text(self, texts: TextInput, prepared: Prepared) -> TextStream: ...

    async def health(self) -> HealthReport: ...


def _arguments(prepared: Prepared) -> dict[str, Any]:
    """The client's named arguments for ``prepared``, the engine options in one mapping."""
    return {
        "voice": prepared.voice,
        "emotion": prepared.emotion,
        "sample_rate": prepared.sample_rate,
        **(
            {"text_format": prepared.text_format, "max_silence": prepared.max_silence}
            if prepared.text_format != "text"
            else {}
        ),
        "options": prepared.options,
    }


async def _engine_voices(client: Client) -> tuple[EngineVoice, ...]:
    """The engine's voices as the sidecar lists them; none for an engine without named voices."""
    try:
        entries = await client.voices()
    except SidecarError as exc:  # an engine without named voices answers invalid_request
        log.info("the engine lists no voices: %s", type(exc).__name__)
        return ()
    return EngineFacts.voices_of(entries)


class PoolBackend:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.facts = EngineFacts()

    async def start(self) -> None:
        await self.pool.start()
        info: Union[SidecarInfo, None] = None
        for client in self.pool.members:
            with contextlib.suppress(RuntimeError):
                info = client.info
                log.info("sidecar ready: engine %s, pid %d", info.engine, info.pid)
        for client in self.pool.members:
            with contextlib.suppress(RuntimeError):
                info = client.info
                voices = await _engine_voices(client) if "voices" in info.capabilities else ()
                self.facts = EngineFacts(info.engine, info.capabilities, info.speed, voices)
                return

    async def aclose(self) -> None:
        await self.pool.aclose()

    def stream(
        self, text: str, prepared: Prepared, *, on_progress: Union[ProgressCallback, None] = None
    ) -> ServedStream:
        return self.pool.stream(text, on_progress=on_progress, **_arguments(prepared))

    def stream_text(self, texts: TextInput, prepared: Prepared) -> TextStream:
        return self.pool.stream_text(texts, **_arguments(prepared))

    async def health(self) -> HealthReport:
        members = await self.pool.health()
        reports = tuple(
            MemberReport(
                index=m.index,
                state=m.state,
                outstanding=m.outstanding,
                served=m.served,
                restarts=m.restarts,
                pid=m.pid,
                device=m.device,
                error=m.error and str(m.error).partition(":")[0],
            )
            for m in members
        )
        return HealthReport(ok=any(m.state == "ready" for m in members), members=reports)


class ReplicaInfo(msgspec.Struct, frozen=True):
    """A Ray replica's sidecar facts, as its ``info`` answers them."""

    engine: str
    capabilities: tuple[str, ...]
    sample_rate: Union[int, None]
    #: The engine's speed control (None: none).
    speed: Union[SpeedControl, None] = None


class ReplicaPing(msgspec.Struct, frozen=True):
    """A Ray replica's answer to ``ping``: its sidecar's health and pid, its Ray node and the
    audio seconds it holds."""

    pid: Union[int, None]
    loaded: bool
    queue_depth: int
    memory: dict[str, int]
    round_trip: float
    node_id: str
    audio_seconds: float


class RayLike(Protocol):
    """What :class:`RayBackend` needs of :class:`indextts_client.ray.RayClient`."""

    async def info(self) -> ReplicaInfo: ...

    async def ping(self) -> ReplicaPing: ...

    def stream(self, text: str, **kwargs: Any) -> ServedStream: ...

    def stream_text(self, texts: TextInput, **kwargs: Any) -> TextStream: ...


class RayBackend:
    """A Ray Serve deployment: Serve owns the replicas, so start and close only ask and forget."""

    def __init__(self, client: RayLike) -> None:
        self.client = client
        self.facts = EngineFacts()

    async def start(self) -> None:
        info = await self.client.info()
        self.facts = EngineFacts(info.engine, info.capabilities, info.speed)

    async def aclose(self) -> None:
        pass

    def stream(
        self, text: str, prepared: Prepared, *, on_progress: Union[ProgressCallback, None] = None
    ) -> ServedStream:
        # A callback would run on the replica, not here: behind Ray a request reports no progress.
        return self.client.stream(text, **_arguments(prepared))

    def stream_text(self, texts: TextInput, prepared: Prepared) -> TextStream:
        return self.client.stream_text(texts, **_arguments(prepared))

    async def health(self) -> HealthReport:
        try:
            replica = await self.client.ping()
        except Exception as exc:
            log.warning("health: the deployment did not answer: %s: %s", type(exc).__name__, exc)
            return HealthReport(ok=False, error=type(exc).__name__)
        return HealthReport(ok=True, replica=msgspec.to_builtins(replica))
