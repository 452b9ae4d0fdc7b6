"""Wire protocol v1 between a parent process and the sidecar.

A frame is a 4-byte big-endian unsigned length followed by exactly that many bytes
holding one MessagePack map.  Every map carries an ``op`` field naming its type.
``docs/protocol.md`` is the normative description; this module is its executable
form.  It imports only the standard library and msgspec, so a parent that never
touches numpy or torch can use it, and so can a third-party engine.

Schema evolution follows msgspec's rules: new fields are added with defaults, unknown
fields are ignored by every decoder, and a field is never removed or retyped within a
protocol version.  A change that breaks those rules bumps :data:`PROTOCOL_VERSION`.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal, Union

import msgspec

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "EMOTION_NAMES",
    "HEADER",
    "MIN_MAX_FRAME_SIZE",
    "PROTOCOL_VERSION",
    "REQUEST_OPS",
    "Audio",
    "Cancel",
    "Done",
    "Emotion",
    "EmotionAudio",
    "EmotionText",
    "EmotionVector",
    "Error",
    "ErrorCode",
    "Load",
    "Ok",
    "Ping",
    "Pong",
    "Progress",
    "Ready",
    "Reply",
    "Request",
    "Shutdown",
    "Synthesize",
    "Unload",
    "Voices",
    "decode_reply",
    "decode_request",
    "describe_invalid",
    "field_of",
    "encode",
    "frame",
    "audio_frame_parts",
    "is_terminal",
]

#: Incremented only for changes that old peers cannot ignore.
PROTOCOL_VERSION: Final = 1
#: Size of the length prefix in bytes.
HEADER: Final = 4
#: Largest frame either side accepts unless configured otherwise (16 MiB).
DEFAULT_MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
#: The smallest limit a sidecar may be configured with; every control message fits.
MIN_MAX_FRAME_SIZE: Final = 64 * 1024

#: The eight emotion dimensions, in the order IndexTTS-2 expects them.
EMOTION_NAMES: Final = (
    "happy",
    "angry",
    "sad",
    "afraid",
    "disgusted",
    "melancholic",
    "surprised",
    "calm",
)

ErrorCode = Literal[
    "invalid_message",  # decodes as msgpack but is not a valid message; names the field
    "unknown_op",  # a map whose ``op`` this sidecar does not know
    "duplicate_id",  # the id is already in flight
    "unknown_option",  # an engine option or request option the engine does not accept
    "invalid_option",  # an option with an out-of-range or ill-typed value
    "invalid_input",  # a request that is well-formed but cannot be served (missing file...)
    "busy",  # the request queue is full; retryable
    "cancelled",  # the request was cancelled by a ``cancel`` message
    "shutting_down",  # the sidecar is stopping and dropped the request
    "load_failed",  # the engine failed to load; the next request retries; retryable
    "engine_error",  # the engine raised while synthesizing
    "frame_too_large",  # framing lost: the sidecar exits after sending this
    "truncated_frame",  # framing lost: the stream ended or stalled inside a frame
    "unknown_engine",  # startup: no engine of that name
    "internal",  # a bug in the sidecar
]


class _Message(msgspec.Struct, tag_field="op", omit_defaults=True, kw_only=True):
    """Base for every message: tagged on ``op``; unknown fields are ignored."""


# --------------------------------------------------------------------- emotion


class EmotionVector(msgspec.Struct, tag_field="kind", tag="vector", kw_only=True, forbid_unknown_fields=True):
    """Emotion as weights over the eight named dimensions, each in [0, 1]."""

    happy: float = 0.0
    angry: float = 0.0
    sad: float = 0.0
    afraid: float = 0.0
    disgusted: float = 0.0
    melancholic: float = 0.0
    surprised: float = 0.0
    calm: float = 0.0
    #: Scales the vector (IndexTTS clamps it to [0, 1]).
    alpha: float = 1.0

    def values(self) -> list[float]:
        return [float(getattr(self, name)) for name in EMOTION_NAMES]


class EmotionAudio(msgspec.Struct, tag_field="kind", tag="audio", kw_only=True, forbid_unknown_fields=True):
    """Emotion taken from a second reference clip, blended by ``alpha``."""

    path: str
    alpha: float = 1.0


class EmotionText(msgspec.Struct, tag_field="kind", tag="text", kw_only=True, forbid_unknown_fields=True):
    """Emotion derived from a description (or from the text itself when ``text`` is None)."""

    text: Union[str, None] = None
    alpha: float = 1.0


Emotion = Union[EmotionVector, EmotionAudio, EmotionText]

# ---------------------------------------------------------- parent -> sidecar


class Synthesize(_Message, tag="synthesize"):
    """Speak ``text``.  Answered by ``progress``/``audio`` frames, then ``done`` or ``error``."""

    id: int
    text: str
    #: Path of a voice reference clip, or a voice name, as the engine defines it.
    voice: Union[str, None] = None
    emotion: Union[Emotion, None] = None
    #: Resample to this rate; None keeps the engine's native rate.
    sample_rate: Union[int, None] = None
    #: Engine-specific request options; unknown keys are rejected by the engine.
    options: dict[str, Any] = msgspec.field(default_factory=dict)


class Load(_Message, tag="load"):
    """Load the engine's model now, reporting progress; answered by ``ok``."""

    id: int


class Unload(_Message, tag="unload"):
    """Drop the model and free its memory; answered by ``ok``."""

    id: int


class Ping(_Message, tag="ping"):
    """Health check, answered by ``pong`` even while an inference runs."""

    id: int


class Cancel(_Message, tag="cancel"):
    """Cancel request ``target``; answered by ``ok`` (the target ends with ``cancelled``)."""

    id: int
    target: int


class Voices(_Message, tag="voices"):
    """List the engine's named voices; answered at once by ``ok`` with ``info.voices``.

    ``info.voices`` is a list of maps, each with at least ``name``.  An engine without
    named voices answers ``invalid_input``.
    """

    id: int


class Shutdown(_Message, tag="shutdown"):
    """Stop: pending requests end with ``shutting_down``, then ``ok``, then exit 0."""

    id: int


Request = Union[Synthesize, Load, Unload, Ping, Cancel, Voices, Shutdown]
REQUEST_OPS: Final = frozenset(("synthesize", "load", "unload", "ping", "cancel", "voices", "shutdown"))

# ---------------------------------------------------------- sidecar -> parent


class Ready(_Message, tag="ready"):
    """First frame on every connection, sent before any engine code is imported."""

    protocol: int
    version: str
    engine: str
    pid: int
    max_frame_size: int
    #: The engine's native rate when it is known without loading the model.
    sample_rate: Union[int, None] = None
    capabilities: list[str] = msgspec.field(default_factory=list)
    #: Engine options that were accepted, after defaults.
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    #: Engine options that the installed engine does not accept and that were dropped.
    dropped_options: list[str] = msgspec.field(default_factory=list)


class Progress(_Message, tag="progress"):
    """Non-terminal progress of request ``id``.  ``fraction`` is None when unknown."""

    id: int
    stage: str
    fraction: Union[float, None] = None
    message: str = ""


class Audio(_Message, tag="audio", kw_only=True):
    """Non-terminal chunk of request ``id``: little-endian int16 mono PCM.

    With shared audio memory (``--shared-audio-fd``), ``pcm`` may be empty and the
    samples be ``shm_size`` bytes at ring position ``shm_offset`` instead.
    """

    id: int
    seq: int
    sample_rate: int
    shm_offset: Union[int, None] = None
    shm_size: int = 0
    #: Always the last field: :func:`audio_frame_parts` relies on it.
    pcm: memoryview


class Done(_Message, tag="done"):
    """Terminal success of a ``synthesize`` request."""

    id: int
    samples: int
    chunks: int
    sample_rate: int
    #: Seconds spent per phase: queued, load, first_audio, synthesis, total.
    timings: dict[str, float] = msgspec.field(default_factory=dict)


class Ok(_Message, tag="ok"):
    """Terminal success of ``load``, ``unload``, ``cancel`` and ``shutdown``."""

    id: int
    info: dict[str, Any] = msgspec.field(default_factory=dict)


class Pong(_Message, tag="pong"):
    """Terminal reply to ``ping``."""

    id: int
    loaded: bool
    #: Requests waiting for the engine worker, not counting the running one.
    queue_depth: int
    #: Id of the request the engine is running, if any.
    active: Union[int, None] = None
    #: Bytes: ``rss`` always; engines add e.g. ``cuda_allocated``, ``cuda_reserved``.
    memory: dict[str, int] = msgspec.field(default_factory=dict)
    uptime: float = 0.0
    dropped_options: list[str] = msgspec.field(default_factory=list)


class Error(_Message, tag="error"):
    """An error.  Terminal for request ``id`` when ``id`` is set; otherwise about the connection."""

    code: str
    message: str
    id: Union[int, None] = None
    retryable: bool = False
    detail: dict[str, Any] = msgspec.field(default_factory=dict)


Reply = Union[Ready, Progress, Audio, Done, Ok, Pong, Error]

# ------------------------------------------------------------------- codecs

_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_loose_decoder = msgspec.msgpack.Decoder()
_EMPTY = memoryview(b"")
_FIELD_RE = re.compile(r" - at `(\$[^`]*)`$")
_NAMED_RE = re.compile(r"(?:missing required|unknown) field `([^`]+)`")


def encode(message: Union[Request, Reply]) -> bytes:
    """The msgpack body of ``message``, without the length prefix."""
    return _encoder.encode(message)


def frame(message: Union[Request, Reply]) -> bytes:
    """``message`` as a complete frame: length prefix and body."""
    body = _encoder.encode(message)
    return len(body).to_bytes(HEADER, "big") + body


def audio_frame_parts(request_id: int, seq: int, sample_rate: int, pcm: memoryview) -> tuple[bytes, memoryview]:
    """An ``audio`` frame as (everything before the samples, the samples themselves).

    Written one after the other (``os.writev``), the two parts form one ``audio`` frame
    whose samples were never copied into an encode buffer: ``pcm`` is the last field of
    ``Audio``, so the frame ends with a msgpack ``bin 32`` header and the raw bytes.
    """
    head = _encoder.encode(Audio(id=request_id, seq=seq, sample_rate=sample_rate, pcm=_EMPTY))
    # ``head`` ends with the empty bin (c4 00); swap in a bin 32 header for the real length.
    size = len(pcm)
    body_size = len(head) - 2 + 5 + size
    return (
        body_size.to_bytes(HEADER, "big") + head[:-2] + b"\xc6" + size.to_bytes(4, "big"),
        pcm,
    )


def decode_request(body: Union[bytes, bytearray, memoryview]) -> Request:
    """Decode a frame body sent by a parent; raises ``msgspec.DecodeError`` or ``ValidationError``."""
    return _request_decoder.decode(body)


def decode_reply(body: Union[bytes, bytearray, memoryview]) -> Reply:
    """Decode a frame body sent by a sidecar.  ``Audio.pcm`` views into ``body`` without copying."""
    return _reply_decoder.decode(body)


def is_terminal(reply: Reply) -> bool:
    """Whether ``reply`` ends its request: every request id gets exactly one of these."""
    if isinstance(reply, Error):
        return reply.id is not None
    return isinstance(reply, (Done, Ok, Pong))


def describe_invalid(body: Union[bytes, bytearray, memoryview], exc: msgspec.MsgspecError) -> Error:
    """The ``error`` frame for a body that failed :func:`decode_request`.

    It names the offending field and carries the request id when one can be read, in
    which case it is that request's terminal frame.
    """
    try:
        loose = _loose_decoder.decode(body)
    except msgspec.MsgspecError as loose_exc:
        exc, loose = loose_exc, None
    request_id = None
    if isinstance(loose, dict):
        candidate = loose.get("id")
        if isinstance(candidate, int) and not isinstance(candidate, bool):
            request_id = candidate
    detail: dict[str, Any] = {}
    if not isinstance(exc, msgspec.ValidationError):
        if len(body) == 0:
            message = "empty frame: a frame must hold one msgpack map"
        else:
            message = f"frame is not valid msgpack: {exc}"
        return Error(code="invalid_message", message=message, detail=detail)
    if not isinstance(loose, dict):
        kind = type(loose).__name__
        return Error(
            code="invalid_message",
            message=f"a message must be a msgpack map with an 'op' field, got {kind}",
            detail={"field": "$"},
        )
    op = loose.get("op")
    if "op" not in loose:
        message = "message has no 'op' field"
        detail["field"] = "$.op"
    elif not isinstance(op, str) or op not in REQUEST_OPS:
        return Error(
            code="unknown_op",
            id=request_id,
            message=f"unknown op {op!r}; expected one of {sorted(REQUEST_OPS)}",
            detail={"field": "$.op", "op": op if isinstance(op, (str, int, float)) else repr(op)},
        )
    else:
        detail["field"] = field_of(exc)
        message = f"invalid {op!r} message: {exc}"
    return Error(code="invalid_message", id=request_id, message=message, detail=detail)


def field_of(exc: msgspec.ValidationError, root: str = "$") -> str:
    """The path of the field a msgspec validation error is about, e.g. ``$.options.rate``."""
    text = str(exc)
    at = _FIELD_RE.search(text)
    path = at.group(1) if at else "$"
    named = _NAMED_RE.search(text)
    if named:
        path = f"{path}.{named.group(1)}"
    return root + path[1:]
