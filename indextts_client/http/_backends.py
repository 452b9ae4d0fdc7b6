"""What the app serves from: a local :class:`Pool`, or a Ray Serve deployment through RayClient."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Protocol, Union

import anyio

from indextts_sidecar.engines import SpeedControl, describe_engine

from .._pool import Pool
from .._types import SidecarInfo

__all__ = ["Backend", "EngineFacts", "PoolBackend", "RayBackend"]

log = logging.getLogger("indextts_client.http")


class EngineFacts:
    """The engine's name, capabilities and speed control, as the HTTP layer needs them."""

    def __init__(
        self, name: str = "", capabilities: tuple[str, ...] = (), speed: Union[SpeedControl, None] = None
    ) -> None:
        self.name, self.capabilities, self.speed = name, capabilities, speed


async def _facts(name: str, capabilities: tuple[str, ...]) -> EngineFacts:
    # The engine's class declares its speed control; importing it loads no model.
    description = await anyio.to_thread.run_sync(describe_engine, name)
    return EngineFacts(name, capabilities, description.speed)


class Backend(Protocol):
    facts: EngineFacts

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def stream(self, text: str, **kwargs: Any) -> Any: ...

    def stream_text(self, texts: Any, **kwargs: Any) -> Any: ...

    async def health(self) -> dict[str, Any]: ...


class PoolBackend:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.facts = EngineFacts()

    async def start(self) -> None:
        await self.pool.start()
        for client in self.pool.members:
            with contextlib.suppress(RuntimeError):
                info: SidecarInfo = client.info
                log.info("sidecar ready: engine %s, pid %d", info.engine, info.pid)
        for client in self.pool.members:
            with contextlib.suppress(RuntimeError):
                self.facts = await _facts(client.info.engine, client.info.capabilities)
                return

    async def aclose(self) -> None:
        await self.pool.aclose()

    def stream(self, text: str, **kwargs: Any) -> Any:
        return self.pool.stream(text, **kwargs)

    def stream_text(self, texts: Any, **kwargs: Any) -> Any:
        return self.pool.stream_text(texts, **kwargs)

    async def health(self) -> dict[str, Any]:
        members = await self.pool.health()
        return {
            "status": "ok" if any(m.state == "ready" for m in members) else "unavailable",
            "members": [
                {
                    "index": m.index,
                    "state": m.state,
                    "outstanding": m.outstanding,
                    "served": m.served,
                    "restarts": m.restarts,
                    "pid": m.pid,
                    "device": m.device,
                    "error": m.error,
                }
                for m in members
            ],
        }


class RayBackend:
    """A Ray Serve deployment: Serve owns the replicas, so start and close only ask and forget."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.facts = EngineFacts()

    async def start(self) -> None:
        info = await self.client.info()
        self.facts = await _facts(str(info["engine"]), tuple(info["capabilities"]))

    async def aclose(self) -> None:
        pass

    def stream(self, text: str, **kwargs: Any) -> Any:
        # A callback would run on the replica, not here: behind Ray a request reports no progress.
        kwargs.pop("on_progress", None)
        return self.client.stream(text, **kwargs)

    def stream_text(self, texts: Any, **kwargs: Any) -> Any:
        return self.client.stream_text(texts, **kwargs)

    async def health(self) -> dict[str, Any]:
        try:
            replica = await self.client.ping()
        except Exception as exc:
            log.warning("health: the deployment did not answer: %s: %s", type(exc).__name__, exc)
            return {"status": "unavailable", "error": type(exc).__name__}
        return {"status": "ok", "replica": replica}
