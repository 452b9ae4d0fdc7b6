"""The wyoming framing (a JSON line, then data, then payload) read under our bounds.

The package's own reader takes any ``data_length``/``payload_length`` a client states and any
nesting its JSON decoder can follow; this one refuses both, and tells a malformed event (the
connection goes on) from one that leaves the stream out of step (it closes).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Union

from wyoming.event import Event

from .._service import Kind, Refusal, check_depth

__all__ = ["BadEvent", "invalid", "read_event", "text_of", "voice_of"]


class BadEvent(Exception):
    """An event that breaks the framing or the limits.  ``fatal``: the stream is out of step
    (a size that cannot be read past), so the connection closes; otherwise it goes on."""

    def __init__(self, message: str, *, code: str = "invalid_event", fatal: bool = False) -> None:
        super().__init__(message)
        self.message, self.code, self.fatal = message, code, fatal


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        check_depth(raw)
    except Refusal as refusal:
        raise BadEvent(f"an event's {what} {refusal.message.removeprefix('the JSON ')}", code=refusal.code) from None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadEvent(f"an event's {what} is not JSON") from None
    if not isinstance(value, dict):
        raise BadEvent(f"an event's {what} is not a JSON object")
    return value


async def read_event(reader: asyncio.StreamReader, limit: int) -> Union[Event, None]:
    """The wyoming framing (a JSON line, then data, then payload), each part at most ``limit``
    bytes (the reader's own limit bounds the line); None at the end of the stream."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise BadEvent(f"an event header is longer than {limit} bytes", code="too_large", fatal=True) from None
    header = _json_object(line, "header")
    sizes = []
    for key in ("data_length", "payload_length"):
        size = header.get(key) or 0
        if not isinstance(size, int) or not 0 <= size <= limit:
            raise BadEvent(f"an event's {key} is not a size of at most {limit} bytes", code="too_large", fatal=True)
        sizes.append(size)
    try:
        extra = await reader.readexactly(sizes[0]) if sizes[0] else b""
        payload = await reader.readexactly(sizes[1]) if sizes[1] else None
    except asyncio.IncompleteReadError:
        return None
    kind, data = header.get("type"), header.get("data") or {}
    if not isinstance(kind, str):
        raise BadEvent("an event header has no type")
    if not isinstance(data, dict):
        raise BadEvent("an event's data is not a JSON object")
    if extra:
        data.update(_json_object(extra, "data"))
    return Event(type=kind, data=data, payload=payload)


def invalid(message: str, code: str = "invalid_event") -> Refusal:
    return Refusal(Kind.INVALID, message, code=code)


def text_of(event: Event) -> str:
    text = event.data.get("text")
    if not isinstance(text, str):
        raise invalid(f"a {event.type} event needs a text (a string)")
    return text


def text_format_of(event: Event) -> str:
    """How a ``synthesize``/``synthesize-start`` asks its text to be read: ``text`` (also when
    it says nothing) or ``ssml``."""
    text_format = event.data.get("text_format")
    if text_format is None:
        return "text"
    if text_format not in ("text", "ssml"):
        raise invalid(f"text_format is 'text' or 'ssml', not {str(text_format)[:40]!r}")
    return str(text_format)


def voice_of(event: Event) -> Union[str, None]:
    """The voice a ``synthesize``/``synthesize-start`` names: its name, else its language."""
    voice = event.data.get("voice")
    if voice is None:
        return None
    name = voice.get("name", voice.get("language")) if isinstance(voice, dict) else voice
    if name is not None and not isinstance(name, str):
        raise invalid(f"a {event.type} event's voice is an object with a name (a string)")
    return name
