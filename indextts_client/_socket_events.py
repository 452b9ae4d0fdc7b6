"""The WebSocket route's server events (``/v1/audio/speech/stream``, docs/serving.md), said once.

msgspec structs tagged by ``type``: the route (``http/_websocket.py``) encodes them, and the
voice-agent integrations (``integrations/pipecat.py``, ``integrations/livekit.py``) decode them
with :func:`decode_server_event`.  Only msgspec: reading them needs no server extra.  The
events a client sends are the route's own (``http/_ws_events.py``).
"""

from __future__ import annotations

from typing import Annotated, Union

import msgspec

__all__ = [
    "AlignedWord",
    "AudioAlignment",
    "AudioDone",
    "AudioStart",
    "ContextCancelled",
    "ContextDone",
    "ContextEvent",
    "MalformedEvent",
    "ServerError",
    "ServerEvent",
    "SessionReady",
    "decode_server_event",
    "encode_event",
]

#: Seconds from a sentence's first sample (a bound a hostile server cannot stretch).
Seconds = Annotated[float, msgspec.Meta(ge=0, lt=1e6)]


class AlignedWord(msgspec.Struct, frozen=True):
    """One spoken word: its text, its start and end, and its character offsets into the
    sentence's text (null where the engine spoke its own text: IndexTTS's segments)."""

    word: str
    start: Seconds
    end: Seconds
    char_start: Union[int, None] = None
    char_end: Union[int, None] = None


class _Event(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    pass


class SessionReady(_Event, tag="session.ready", kw_only=True, frozen=True):
    """The connection is served: contexts may be opened."""


class ServerError(_Event, tag="error", kw_only=True, frozen=True, omit_defaults=True):
    """A refusal: of a context's (``context_id``), or of the connection's (none: its end follows)."""

    code: str
    message: str
    param: Union[str, None] = None
    context_id: Union[str, None] = None


class ContextEvent(_Event, kw_only=True, frozen=True):
    """An event of one context (every event but ``session.ready`` and ``error``)."""

    context_id: str


class ContextDone(ContextEvent, tag="context.done", kw_only=True, frozen=True):
    """Every sentence of the context was delivered."""


class ContextCancelled(ContextEvent, tag="context.cancelled", kw_only=True, frozen=True):
    """The context ended on the client's ``context.cancel``."""


class AudioStart(ContextEvent, tag="audio.start", kw_only=True, frozen=True):
    """A sentence's audio follows, in binary frames."""

    sentence: int = 0
    text: str = ""
    response_format: str = "pcm"
    #: 0: not said (the client's own rate stands).
    sample_rate: int = 0


class AudioAlignment(ContextEvent, tag="audio.alignment", kw_only=True, frozen=True):
    """A sentence's words (``granularity`` ``segment``: segments stand in for them)."""

    sentence: int = 0
    granularity: str = "word"
    words: list[AlignedWord] = []


class AudioDone(ContextEvent, tag="audio.done", kw_only=True, frozen=True):
    """A sentence's audio has all been sent."""

    sentence: int = 0
    samples: int = 0
    bytes: int = 0
    flushed: bool = False


ServerEvent = Union[SessionReady, ServerError, ContextDone, ContextCancelled, AudioStart, AudioAlignment, AudioDone]

_decoder = msgspec.json.Decoder(ServerEvent)
_encoder = msgspec.json.Encoder()


class _Typed(msgspec.Struct):
    type: Union[str, None] = None
    context_id: object = None


_typed = msgspec.json.Decoder(_Typed)
_KNOWN = frozenset(
    cls.__struct_config__.tag
    for cls in (SessionReady, ServerError, ContextDone, ContextCancelled, AudioStart, AudioAlignment, AudioDone)
)


class MalformedEvent(ValueError):
    """A server event that is not JSON, or an event of a known type whose fields are wrong;
    ``context_id``: the context it names, if it names one."""

    def __init__(self, message: str, context_id: Union[str, None] = None) -> None:
        super().__init__(message)
        self.context_id = context_id


def encode_event(event: ServerEvent) -> str:
    """The event as the route sends it: one JSON object, ``type`` first."""
    return _encoder.encode(event).decode()


def decode_server_event(text: Union[str, bytes]) -> Union[ServerEvent, None]:
    """The event ``text`` holds; None for one of a type this client does not know (a newer
    server's); :class:`MalformedEvent` for anything else."""
    try:
        typed = _typed.decode(text)
    except msgspec.DecodeError as exc:  # not a JSON object (ValidationError is one)
        raise MalformedEvent(f"a server event is one JSON object: {exc}") from None
    kind = typed.type
    if kind not in _KNOWN:
        return None
    try:
        return _decoder.decode(text)
    except msgspec.ValidationError as exc:
        context_id = typed.context_id if isinstance(typed.context_id, str) else None
        if str(exc).endswith((".start`", ".end`")) and "$.words[" in str(exc):
            reason = f"a word's time is not a number of seconds ({exc})"
            raise MalformedEvent(f"{kind}: {reason}", context_id) from None
        raise MalformedEvent(f"{kind}: {exc}", context_id) from None
