"""Wire protocol v1 between a parent process and the sidecar.

A frame is a 4-byte big-endian unsigned length followed by exactly that many bytes
holding one MessagePack map.  Every map carries an ``op`` field naming its type.
``docs/protocol.md`` is the normative description; this package is its executable
form.  It imports only the standard library and msgspec, so a parent that never
touches numpy or torch can use it, and so can a third-party engine.

Every name is importable from here, as it always was; they live in:

``messages``
    the schema: the messages, their limits, :data:`REQUEST_OPS`;
``_codec``
    encoding and decoding, frames, ``audio`` frames in two parts;
``_peek``
    the skimmer that reads ``op``, ``id`` and depth of a message that may not decode;
``errors``
    the ``error`` frame for a message that failed to decode, and :func:`field_of`.

Beside them: ``framing`` and ``streams`` (frames over byte streams), ``auth`` and
``address`` (the socket transport), ``options``, ``doctor``, ``engine_info``, ``defaults`` and
``segments`` (the text span a synthesize progress announces).
"""

from __future__ import annotations

from ._codec import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER,
    MIN_MAX_FRAME_SIZE,
    audio_frame_parts,
    decode_reply,
    decode_request,
    encode,
    frame,
    nests_deeper,
)
from ._peek import Peek, peek
from .errors import describe_invalid, field_of
from .messages import (
    EMOTION_CAPABILITIES,
    EMOTION_NAMES,
    MAX_DEPTH,
    MAX_ID,
    PROTOCOL_VERSION,
    QUIET_PROGRESS_INTERVAL,
    REGISTERED_PREFIX,
    REQUEST_OPS,
    Audio,
    Cancel,
    Done,
    Emotion,
    EmotionAudio,
    EmotionText,
    EmotionVector,
    Error,
    ErrorCode,
    Load,
    Ok,
    Ping,
    Pong,
    Progress,
    Ready,
    RegisterVoice,
    Reply,
    Request,
    RequestId,
    Shutdown,
    Synthesize,
    Unload,
    Voices,
    WordSpan,
    is_terminal,
)

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "EMOTION_CAPABILITIES",
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
    "RequestId",
    "Shutdown",
    "Synthesize",
    "Unload",
    "Voices",
    "WordSpan",
    "decode_reply",
    "decode_request",
    "describe_invalid",
    "field_of",
    "encode",
    "frame",
    "nests_deeper",
    "audio_frame_parts",
    "is_terminal",
    "peek",
]
