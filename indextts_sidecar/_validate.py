"""A ``synthesize`` request checked and resolved into what the engine runs: a pure function.

:func:`validate_synthesis` reads no socket and starts no thread: everything it needs (the
engine's checks, the limits, the path policy, the registered voices) is passed in, so it
is tested without processes (tests/sidecar/test_validate.py).  It raises
:class:`~.engines.EngineError` (or its :class:`~.engines.RequestError`) naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

import msgspec

from . import protocol
from ._defaults import DEFAULT_MAX_TEXT
from ._paths import PathPolicy
from .engines import Engine, EngineError, RequestError, SynthesisRequest
from .protocol import REGISTERED_PREFIX, Emotion, EmotionAudio, Synthesize

if TYPE_CHECKING:  # hashlib and tempfile load only for a sidecar that stores voices
    from ._voices import RegisteredVoices

__all__ = ["DEFAULT_MAX_TEXT", "RequestLimits", "validate_synthesis"]

#: Output rates a request may ask for, in Hz.
MIN_SAMPLE_RATE = 1000
MAX_SAMPLE_RATE = 384000

UPLOADS_ONLY = (
    "this sidecar takes no file paths (it listens without --voice-dir): upload the clip with register_voice "
    "and name it as 'registered:NAME'"
)


@dataclass(frozen=True)
class RequestLimits:
    """What a connection's requests may ask for."""

    #: Longest ``text``, in characters (``--max-text``).
    max_text: int = DEFAULT_MAX_TEXT
    #: Which files a request may name, and how large (``--voice-dir``, ``--max-voice-bytes``).
    paths: PathPolicy = field(default_factory=PathPolicy)
    #: False: requests may name no files (a socket without ``--voice-dir``), only registered voices.
    path_voices: bool = True


def validate_synthesis(
    engine: Engine[Any, Any],
    message: Synthesize,
    limits: RequestLimits,
    voices: Union[RegisteredVoices, None] = None,
) -> SynthesisRequest[Any]:
    """What the engine runs for ``message``: options decoded, voices resolved, paths checked."""
    try:
        options = msgspec.convert(message.options, engine.RequestOptions)
    except msgspec.ValidationError as exc:
        text = str(exc)
        code = "unknown_option" if "unknown field" in text else "invalid_option"
        raise EngineError(f"options: {text}", code=code, field=protocol.field_of(exc, "$.options")) from None
    if len(message.text) > limits.max_text:
        raise EngineError(
            f"text of {len(message.text)} characters is longer than the limit of {limits.max_text} (--max-text)",
            code="invalid_input",
            field="$.text",
        )
    if message.sample_rate is not None and not MIN_SAMPLE_RATE <= message.sample_rate <= MAX_SAMPLE_RATE:
        raise EngineError(
            f"sample_rate {message.sample_rate} is outside {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz",
            code="invalid_option",
            field="$.sample_rate",
        )
    voice = message.voice
    emotion = message.emotion
    if emotion is not None:
        _check_emotion_capability(engine, emotion)
    if voice is not None and voice.startswith(REGISTERED_PREFIX):
        voice = _registered(voices, voice, "$.voice")
    elif voice is not None and engine.reads_paths and not limits.path_voices:
        raise RequestError(UPLOADS_ONLY, field="$.voice")
    if isinstance(emotion, EmotionAudio):
        if emotion.path.startswith(REGISTERED_PREFIX):
            emotion = EmotionAudio(path=_registered(voices, emotion.path, "$.emotion.path"), alpha=emotion.alpha)
        elif engine.reads_paths and not limits.path_voices:
            raise RequestError(UPLOADS_ONLY, field="$.emotion.path")
    if engine.reads_paths:
        if voice is not None:
            limits.paths.check(voice, "$.voice", "voice reference")
        if isinstance(emotion, EmotionAudio):
            limits.paths.check(emotion.path, "$.emotion.path", "emotion reference")
    request = SynthesisRequest(
        id=message.id,
        text=message.text,
        voice=voice,
        emotion=emotion,
        options=options,
        sample_rate=message.sample_rate,
        stream=message.stream,
    )
    engine.check(request)
    return request


def _registered(voices: Union[RegisteredVoices, None], value: str, field: str) -> str:
    """The file a ``registered:NAME`` stands for."""
    if voices is None:
        raise RequestError(f"{value!r} names a registered voice, but this sidecar has no --voice-dir", field=field)
    return voices.resolve(value, field)


#: Each kind of emotion, the capability an engine declares for it and what it is called.
def _check_emotion_capability(engine: Engine[Any, Any], emotion: Emotion) -> None:
    """An emotion the engine cannot apply is refused, never silently dropped (the HTTP server
    refuses it the same way, before it reaches a sidecar)."""
    capability, what = protocol.EMOTION_CAPABILITIES[type(emotion)]
    if capability not in type(engine).capabilities:
        raise EngineError(f"engine {type(engine).name!r} has no {what}", code="unsupported", field="$.emotion")
