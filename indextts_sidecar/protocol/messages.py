"""The schema of wire protocol v1: every message as a msgspec struct, tagged on ``op``.

``docs/protocol.md`` is the normative description.  Schema evolution follows msgspec's
rules: new fields are added with defaults, unknown fields are ignored by every decoder,
and a field is never removed or retyped within a protocol version.  A change that breaks
those rules bumps :data:`PROTOCOL_VERSION`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, Union, get_args

import msgspec

from .engine_info import SpeedControl

__all__ = [
    "EMOTION_CAPABILITIES",
    "EMOTION_NAMES",
    "MAX_DEPTH",
    "MAX_ID",
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
    "Ping",
    "Pong",
    "Progress",
    "Ready",
    "RegisterVoice",
    "Reply",
    "Request",
    "RequestId",
    "Shutdown",
    "Synthesize",
    "Unload",
    "Voices",
    "WordSpan",
    "is_terminal",
]

#: Incremented only for changes that old peers cannot ignore.
PROTOCOL_VERSION: Final = 1

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

#: The capability an engine declares (``ready.capabilities``) for each kind of emotion, and
#: what a refusal calls it.  The one table: the sidecar checks a request against it before
#: queueing, the serving core before sending.
EMOTION_CAPABILITIES: Mapping[type[Emotion], tuple[str, str]] = MappingProxyType(
    {
        EmotionVector: ("emotion_vector", "emotion weights"),
        EmotionAudio: ("emotion_audio", "emotion from a reference clip"),
        EmotionText: ("emotion_text", "emotion from a description"),
    }
)

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
    #: True: the parent plays or forwards the audio as it comes (``Client.stream``), so the engine
    #: may trade a little speed for earlier first audio; False (absent): it waits for the whole.
    stream: bool = False


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

    id: RequestId


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
#: The ``op`` of every request, read from the union's tags so that a new request is listed by itself.
REQUEST_OPS: Final[frozenset[str]] = frozenset(
    tag for message in get_args(Request) if isinstance(tag := message.__struct_config__.tag, str)
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
    #: Requests the engine runs at once as one batch at most; 1: one at a time (older sidecars send none).
    max_batch: int = 1
    capabilities: list[str] = msgspec.field(default_factory=list)
    #: Engine options that were accepted, after defaults.
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    #: Engine options that the installed engine does not accept and that were dropped.
    dropped_options: list[str] = msgspec.field(default_factory=list)
    #: The engine's speed control (its request option and range), so that a server maps a
    #: request's ``speed`` without importing the engine; None: it has none (or an older sidecar).
    speed: Union[SpeedControl, None] = None


class Progress(_Message, tag="progress"):
    """Non-terminal progress of request ``id``.  ``fraction`` is None when unknown."""

    id: int
    stage: str
    fraction: Union[float, None] = None
    message: str = ""


class WordSpan(msgspec.Struct, array_like=True, frozen=True):
    """One word the audio speaks: characters ``[start_char, end_char)`` of the request's
    ``text`` (code points, as Python slices), spoken by samples ``[start, end)`` counted from
    the request's first sample.  On the wire a 4-array; in an ``audio`` or ``done`` frame the
    samples are at that frame's ``sample_rate`` (the sidecar rescales an engine's native-rate
    positions when it resamples)."""

    start_char: int
    end_char: int
    start: int
    end: int


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
    #: Words whose first sample is in this chunk or before it and that no earlier frame of
    #: the request carried, from engines with the ``word_timings`` capability; else empty.
    words: list[WordSpan] = msgspec.field(default_factory=list)
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
    #: Words the engine reported after the request's last ``audio`` frame (rare: engines
    #: report a word before the chunk that starts it); at ``sample_rate``.
    words: list[WordSpan] = msgspec.field(default_factory=list)


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


def is_terminal(reply: Reply) -> bool:
    """Whether ``reply`` ends its request: every request id gets exactly one of these."""
    if isinstance(reply, Error):
        return reply.id is not None
    return isinstance(reply, (Done, Ok, Pong))
