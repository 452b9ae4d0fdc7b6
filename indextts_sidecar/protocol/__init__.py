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
from typing import Annotated, Any, Final, Literal, NamedTuple, Union

import msgspec

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "EMOTION_NAMES",
    "HEADER",
    "MAX_DEPTH",
    "MAX_ID",
    "MIN_MAX_FRAME_SIZE",
    "PROTOCOL_VERSION",
    "QUIET_PROGRESS_INTERVAL",
    "REGISTERED_PREFIX",
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
    "Peek",
    "Ping",
    "Pong",
    "Progress",
    "Ready",
    "RegisterVoice",
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
    "peek",
]

#: Incremented only for changes that old peers cannot ignore.
PROTOCOL_VERSION: Final = 1
#: Size of the length prefix in bytes.
HEADER: Final = 4
#: Largest frame either side accepts unless configured otherwise (16 MiB).
DEFAULT_MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
#: The smallest limit a sidecar may be configured with; every control message fits.
MIN_MAX_FRAME_SIZE: Final = 64 * 1024

#: Largest request id: ids are unsigned and fit in a signed 64-bit integer.
MAX_ID: Final = 2**63 - 1
#: Nesting a request may always use (the top-level map is level 1); the Python client
#: refuses to send deeper messages, and a sidecar may answer them with ``invalid_message``.
MAX_DEPTH: Final = 64
#: Seconds: a request that asked for no progress (``progress: false``) still gets a ``progress``
#: frame when none of its frames went out for this long, so that the parent sees it alive.
QUIET_PROGRESS_INTERVAL: Final = 1.0

#: A request id: 0 ..= 2^63-1.
RequestId = Annotated[int, msgspec.Meta(ge=0, le=MAX_ID)]

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
    "unauthorized",  # socket transport: the token was refused (connection-level, then closed)
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

    id: RequestId
    text: str
    #: Path of a voice reference clip, or a voice name, as the engine defines it.
    voice: Union[str, None] = None
    emotion: Union[Emotion, None] = None
    #: Resample to this rate; None keeps the engine's native rate.
    sample_rate: Union[int, None] = None
    #: Engine-specific request options; unknown keys are rejected by the engine.
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    #: False: the parent does not want this request's ``progress``; the sidecar sends one only
    #: as a sign of life, when nothing of the request went out for :data:`QUIET_PROGRESS_INTERVAL`.
    progress: bool = True


class Load(_Message, tag="load"):
    """Load the engine's model now, reporting progress; answered by ``ok``."""

    id: RequestId


class Unload(_Message, tag="unload"):
    """Drop the model and free its memory; answered by ``ok``."""

    id: RequestId


class Ping(_Message, tag="ping"):
    """Health check, answered by ``pong`` even while an inference runs."""

    id: RequestId


class Cancel(_Message, tag="cancel"):
    """Cancel request ``target``; answered by ``ok`` (the target ends with ``cancelled``)."""

    id: RequestId
    target: int


class Voices(_Message, tag="voices"):
    """List the engine's named voices; answered at once by ``ok`` with ``info.voices``.

    ``info.voices`` is a list of maps, each with at least ``name``.  An engine without
    named voices answers ``invalid_input``.
    """

    id: int


class Shutdown(_Message, tag="shutdown"):
    """Stop: pending requests end with ``shutting_down``, then ``ok``, then exit 0."""

    id: RequestId


class RegisterVoice(_Message, tag="register_voice"):
    """Store a reference clip on the sidecar under ``name``; answered by ``ok`` at once.

    Requests then name it as ``voice`` (or an emotion ``path``) ``registered:NAME``.
    """

    id: RequestId
    name: str
    audio: bytes


Request = Union[Synthesize, Load, Unload, Ping, Cancel, Voices, Shutdown, RegisterVoice]
REQUEST_OPS: Final = frozenset(
    ("synthesize", "load", "unload", "ping", "cancel", "voices", "shutdown", "register_voice")
)

#: The prefix of a ``voice`` (or emotion ``path``) naming a clip stored with ``register_voice``.
REGISTERED_PREFIX: Final = "registered:"

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

    ``shm_offset`` and ``shm_size`` are reserved: a sidecar of an older version sent samples
    through a shared-memory ring when its parent offered one; no current parent or sidecar
    does, and a parent fails the connection on an ``audio`` frame that sets ``shm_offset``.
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
    #: What the engine reports about this request (``voice_cache``: ``hit`` or ``miss``);
    #: engine-defined keys, msgpack-able values; older sidecars send none.
    facts: dict[str, Any] = msgspec.field(default_factory=dict)


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


class Peek(NamedTuple):
    """What :func:`peek` could read of a message without decoding it."""

    #: Whether the body is a msgpack map (the rest may still be malformed).
    is_map: bool
    #: The top-level ``op`` when it is a valid string, else None.
    op: Union[str, None]
    #: Whether the map has an ``op`` key at all.
    has_op: bool
    #: The top-level ``id`` when it is a valid request id (0 ..= MAX_ID), else None.
    id: Union[int, None]
    #: The top-level ``id`` as found, valid or not (None when absent or not an int).
    raw_id: Union[int, None]
    #: The deepest nesting seen (the top-level map is 1), up to where reading stopped.
    depth: int


class _Malformed(Exception):
    pass


_FIXED = {  # msgpack type byte -> bytes that follow it (scalars of fixed size)
    0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
    0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,
}  # fmt: skip
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin and str: length bytes
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}  # ext: length bytes, then a type byte
_CONTAINER = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # length bytes, items per entry


def _header(data: memoryview, pos: int) -> tuple[int, int, int]:
    """One item's header at ``pos``: (kind, argument, position after the header).

    kind 0: a scalar, argument 0, the position is after the whole item; 1: a string
    of ``argument`` bytes that follow; 2: a container of ``argument`` items that follow
    (a map of n pairs counts 2n); 3: an integer whose value is the argument.
    """
    end = len(data)
    if pos >= end:
        raise _Malformed
    b = data[pos]
    pos += 1
    if b <= 0x7F:
        return 3, b, pos
    if b >= 0xE0:
        return 3, b - 0x100, pos
    if b <= 0x8F:
        return 2, 2 * (b & 0x0F), pos
    if b <= 0x9F:
        return 2, b & 0x0F, pos
    if b <= 0xBF:
        return 1, b & 0x1F, pos
    if 0xCC <= b <= 0xD3:
        size = _FIXED[b]
        if pos + size > end:
            raise _Malformed
        value = int.from_bytes(data[pos : pos + size], "big", signed=b >= 0xD0)
        return 3, value, pos + size
    if b in _FIXED:
        pos += _FIXED[b]
    elif b in _SIZED:
        size = _SIZED[b]
        if pos + size > end:
            raise _Malformed
        length = int.from_bytes(data[pos : pos + size], "big")
        if b >= 0xD9:
            return 1, length, pos + size
        pos += size + length
    elif b in _EXT:
        size = _EXT[b]
        if pos + size > end:
            raise _Malformed
        pos += size + 1 + int.from_bytes(data[pos : pos + size], "big")
    elif b in _CONTAINER:
        size, per = _CONTAINER[b]
        if pos + size > end:
            raise _Malformed
        return 2, per * int.from_bytes(data[pos : pos + size], "big"), pos + size
    else:  # 0xc1 is never used
        raise _Malformed
    if pos > end:
        raise _Malformed
    return 0, 0, pos


#: Items :func:`peek` reads at most (about 0.5 s of Python): a message of millions of
#: small items is not worth stalling the sidecar's event loop for.
_PEEK_BUDGET = 1_000_000


def _skip(data: memoryview, pos: int, level: int, budget: list[int]) -> tuple[int, int]:
    """Skip one item at nesting ``level``; return the position after it and the deepest level seen.

    Iterative: a message nested a million levels deep costs memory for a list of
    counts, never the interpreter's stack.  ``budget[0]`` counts down the items read.
    """
    remaining = [1]
    deepest = level
    while True:
        while remaining and remaining[-1] == 0:
            remaining.pop()
        if not remaining:
            return pos, deepest
        remaining[-1] -= 1
        budget[0] -= 1
        if budget[0] < 0:
            raise _Malformed
        kind, argument, pos = _header(data, pos)
        if kind == 1:
            pos += argument
            if pos > len(data):
                raise _Malformed
        elif kind == 2:
            remaining.append(argument)
            deepest = max(deepest, level + len(remaining) - 1)


def peek(body: Union[bytes, bytearray, memoryview]) -> Peek:
    """Read a message's top-level ``op`` and ``id`` and its depth, whatever else is wrong with it.

    Nothing but those two fields is decoded: the rest is skipped, so invalid UTF-8, an
    unhashable key or deep nesting elsewhere in the message cannot hide the request's id.
    Never raises; stops after a million items (what follows them is not read).
    """
    data = memoryview(body).cast("B") if isinstance(body, memoryview) else memoryview(body)
    op: Union[str, None] = None
    has_op = False
    raw_ids: list[Union[int, None]] = []
    depth = 0
    budget = [_PEEK_BUDGET]
    try:
        kind, count, pos = _header(data, 0)
        depth = 1
        if kind != 2 or data[0] in range(0x90, 0xA0) or data[0] in (0xDC, 0xDD):
            return Peek(False, None, False, None, None, depth)
        for _ in range(count // 2):
            kind, argument, after = _header(data, pos)
            key: Union[str, None] = None
            if kind == 1:
                try:
                    key = bytes(data[after : after + argument]).decode("utf-8")
                except UnicodeDecodeError:
                    key = None
                pos = after + argument
                if pos > len(data):
                    raise _Malformed
            else:
                pos, deepest = _skip(data, pos, 1, budget)
                depth = max(depth, deepest)
            if key in ("op", "id"):
                kind, argument, after = _header(data, pos)
                if key == "op":
                    has_op = True
                    op = None
                    if kind == 1:
                        try:
                            op = bytes(data[after : after + argument]).decode("utf-8")
                        except UnicodeDecodeError:
                            op = None
                else:
                    raw_ids.append(argument if kind == 3 else None)
            pos, deepest = _skip(data, pos, 1, budget)
            depth = max(depth, deepest)
    except _Malformed:
        pass
    raw_id = raw_ids[-1] if raw_ids else None  # the last one, as the decoder takes it
    valid = raw_id if raw_id is not None and 0 <= raw_id <= MAX_ID else None
    return Peek(depth >= 1, op, has_op, valid, raw_id, depth)


def _kind_name(first: int) -> str:
    """The Python name of the msgpack type starting with byte ``first``."""
    if first <= 0x7F or first >= 0xE0 or 0xCC <= first <= 0xD3:
        return "int"
    if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD):
        return "list"
    if 0xA0 <= first <= 0xBF or 0xD9 <= first <= 0xDB:
        return "str"
    names = {0xC0: "NoneType", 0xC2: "bool", 0xC3: "bool", 0xCA: "float", 0xCB: "float"}
    return names.get(first, "bytes" if first in (0xC4, 0xC5, 0xC6) else "ext")


def describe_invalid(body: Union[bytes, bytearray, memoryview], exc: BaseException) -> Error:
    """The ``error`` frame for a body that failed :func:`decode_request`.

    It names the offending field and carries the request id when one can be read, in
    which case it is that request's terminal frame.  ``exc`` is what decoding raised:
    a msgspec error, or ``RecursionError`` for a message nested too deep to decode.
    """
    peeked = peek(body)
    request_id = peeked.id
    if len(body) == 0:
        return Error(code="invalid_message", message="empty frame: a frame must hold one msgpack map")
    if not peeked.is_map:
        if peeked.depth == 0:
            return Error(code="invalid_message", message=f"frame is not valid msgpack: {exc}")
        return Error(
            code="invalid_message",
            message=f"a message must be a msgpack map with an 'op' field, got {_kind_name(body[0])}",
            detail={"field": "$"},
        )
    if not peeked.has_op:
        return Error(
            code="invalid_message", id=request_id, message="message has no 'op' field", detail={"field": "$.op"}
        )
    op = peeked.op
    if op not in REQUEST_OPS:
        return Error(
            code="unknown_op",
            id=request_id,
            message=f"unknown op {op!r}; expected one of {sorted(REQUEST_OPS)}",
            detail={"field": "$.op", "op": op if op is not None else None},
        )
    if peeked.raw_id is not None and peeked.id is None:
        return Error(
            code="invalid_message",
            message=f"request id {peeked.raw_id} is outside 0..{MAX_ID}",
            detail={"field": "$.id"},
        )
    if isinstance(exc, RecursionError) or peeked.depth > MAX_DEPTH:
        return Error(
            code="invalid_message",
            id=request_id,
            message=f"invalid {op!r} message: nested {peeked.depth} levels deep, more than {MAX_DEPTH}",
            detail={"field": "$", "depth": peeked.depth},
        )
    if isinstance(exc, msgspec.ValidationError):
        return Error(
            code="invalid_message",
            id=request_id,
            message=f"invalid {op!r} message: {exc}",
            detail={"field": field_of(exc)},
        )
    return Error(code="invalid_message", id=request_id, message=f"invalid {op!r} message: not valid msgpack: {exc}")


def field_of(exc: msgspec.ValidationError, root: str = "$") -> str:
    """The path of the field a msgspec validation error is about, e.g. ``$.options.rate``."""
    text = str(exc)
    at = _FIELD_RE.search(text)
    path = at.group(1) if at else "$"
    named = _NAMED_RE.search(text)
    if named:
        path = f"{path}.{named.group(1)}"
    return root + path[1:]
