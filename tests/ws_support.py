"""The WebSocket route's tests' client: the `websockets` package's own, messages parsed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Union

import anyio
from http_support import AUTH, Server
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

#: Seconds any one wait in a test may take before it fails (the server answers in milliseconds).
WAIT = 30.0


class Socket:
    """One connection, its messages parsed: JSON events as dicts, audio as (context_id, bytes)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, type: str, **fields: Any) -> None:
        await self.ws.send(json.dumps({"type": type, **fields}))

    async def next(self) -> Union[dict[str, Any], tuple[str, bytes]]:
        with anyio.fail_after(WAIT):
            message = await self.ws.recv()
        if isinstance(message, bytes):
            n = message[0]
            return message[1 : 1 + n].decode("ascii"), message[1 + n :]
        event: dict[str, Any] = json.loads(message)
        return event

    async def drain(self) -> tuple[list[Any], ConnectionClosed]:
        """What is left to read, and how the connection ended."""
        rest = []
        while True:
            try:
                rest.append(await self.next())
            except ConnectionClosed as exc:
                return rest, exc

    async def until_done(self, *contexts: str) -> list[Any]:
        """Every message up to the ``context.done`` (or ``context.cancelled``, or error) of each of ``contexts``."""
        left, got = set(contexts), []
        while left:
            item = await self.next()
            got.append(item)
            if isinstance(item, dict) and item["type"] in ("context.done", "context.cancelled", "error"):
                left.discard(item.get("context_id"))
        return got


def url(s: Server) -> str:
    return s.base.replace("http://", "ws://") + "/v1/audio/speech/stream"


@asynccontextmanager
async def session(s: Server, *, auth: bool = True, **kwargs: Any) -> AsyncIterator[Socket]:
    """A connection to ``s``'s WebSocket route; with ``auth``, past its ``session.ready``."""
    headers = AUTH if auth else None
    async with connect(url(s), additional_headers=headers, open_timeout=WAIT, **kwargs) as ws:
        sock = Socket(ws)
        if auth:
            assert (await sock.next())["type"] == "session.ready"
        yield sock
