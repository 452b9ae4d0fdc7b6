"""What the LiveKit tests share: the route's own traffic, recorded (an aiohttp session whose
WebSocket class keeps what it sends and receives), and the bare route as the reference."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
from http_support import Server
from ws_support import session

#: Seconds any one wait may take (the server answers in milliseconds, espeak speaks a sentence in a few).
WAIT = 30.0


class Traffic:
    """What the WebSockets of :func:`recording_session` sent and received, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self._changed = asyncio.Event()

    def add(self, direction: str, item: Any) -> None:
        self.log.append((direction, item))
        self._changed.set()

    def sent(self) -> list[dict[str, Any]]:
        return [item for direction, item in self.log if direction == "sent"]

    def received(self) -> list[Any]:
        return [item for direction, item in self.log if direction == "received"]

    async def until(self, predicate: Callable[[Any], bool]) -> None:
        """Until a received item satisfies ``predicate`` (bounded by the caller's timeout)."""
        while not any(predicate(item) for item in self.received()):
            self._changed.clear()
            await self._changed.wait()


def recording_session() -> tuple[aiohttp.ClientSession, Traffic]:
    """An aiohttp session whose WebSockets record their traffic: events, and audio as (context, bytes)."""
    traffic = Traffic()

    class Recording(aiohttp.ClientWebSocketResponse):
        async def send_str(self, data: str, compress: int | None = None) -> None:
            traffic.add("sent", json.loads(data))
            await super().send_str(data, compress)

        async def receive(self, timeout: float | None = None) -> aiohttp.WSMessage:
            message = await super().receive(timeout)
            if message.type is aiohttp.WSMsgType.TEXT:
                traffic.add("received", json.loads(message.data))
            elif message.type is aiohttp.WSMsgType.BINARY:
                n = message.data[0]
                traffic.add("received", (message.data[1 : 1 + n].decode(), message.data[1 + n :]))
            return message

    return aiohttp.ClientSession(ws_response_class=Recording), traffic


async def bare_route(s: Server, *pieces: str, voice: str = "alloy") -> tuple[bytes, list[dict[str, Any]]]:
    """``pieces`` of text through the route with the ``websockets`` client: its PCM and its events."""
    audio, events = b"", []
    async with session(s) as ws:
        await ws.send("context.config", context_id="ref", voice=voice, response_format="pcm", sample_rate=24000)
        for piece in pieces:
            await ws.send("input.text", context_id="ref", text=piece)
        await ws.send("input.done", context_id="ref")
        for item in await ws.until_done("ref"):
            if isinstance(item, tuple):
                audio += item[1]
            else:
                events.append(item)
    assert events[-1]["type"] == "context.done", events[-1]
    return audio, events


def timed_words(audio_done_and_alignments: list[dict[str, Any]], rate: int = 24000) -> list[tuple[float, float]]:
    """The words' (start, end) in seconds from the reply's first sample, from the route's events."""
    words, offset = [], 0
    for event in audio_done_and_alignments:
        if event["type"] == "audio.alignment":
            words += [(offset / rate + w["start"], offset / rate + w["end"]) for w in event["words"]]
        elif event["type"] == "audio.done":
            offset += event["samples"]
    return words
