"""One preparation of a request for every front end: the shared fields in, what the sidecar gets out.

:func:`prepare` takes :class:`~.fields.SpeechSettings` and works in one order: the voice, the
emotion, the speed and the engine options, the sample rate; the first thing wrong is a
:class:`~.refusal.Refusal` naming its field, before anything reaches a sidecar.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from indextts_sidecar import protocol
from indextts_sidecar.protocol import EMOTION_NAMES, Emotion, EmotionAudio, EmotionText, EmotionVector

from .._defaults import DEFAULT_MAX_SILENCE
from .facts import EngineFacts
from .fields import SpeechSettings
from .refusal import Kind, Refusal
from .voices import Resolved, VoiceSources

__all__ = ["CLIENT_PARAMETERS", "PCM_RATE", "Prepared", "check_text", "engine_options", "prepare", "speed_options"]

#: The rate OpenAI's ``pcm`` format is defined at.
PCM_RATE = 24000


@dataclass(frozen=True)
class Prepared:
    """What the sidecar is asked for: ``voice`` (None: the engine's default), the protocol
    ``emotion``, the output ``sample_rate`` (None: the engine's), and the engine's request
    ``options`` (a mapping, the speed's option among them)."""

    voice: Union[str, None] = None
    emotion: Union[Emotion, None] = None
    sample_rate: Union[int, None] = None
    options: Mapping[str, Any] = field(default_factory=dict)
    response_format: str = "pcm"
    #: Where the voice was found.
    voice_source: str = "openai"
    #: ``text`` or ``ssml``: how the client reads the text.
    text_format: str = "text"
    #: Seconds an SSML text's breaks may add up to (the server's ``--max-silence``).
    max_silence: float = DEFAULT_MAX_SILENCE


#: The names the client's request methods take for themselves (``timeout``, ``voice``,
#: ``stream_text``'s ``lookahead``...): an engine option never takes one, so that nobody reading
#: a request's options confuses it with the client's own argument (tests/client/test_signature.py
#: keeps this set equal to those methods' keyword-only parameters).
CLIENT_PARAMETERS = frozenset(
    {
        "voice",
        "emotion",
        "sample_rate",
        "on_progress",
        "timeout",
        "idle_timeout",
        "text_format",
        "ssml_strict",
        "max_silence",
        "options",
        "lookahead",
        "max_sentence_chars",
    }
)


def engine_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as the engine's request options; a name the client takes itself is refused
    (it would set the client's own argument: ``timeout``, ``idle_timeout``, the server's bounds)."""
    for name in options:
        if name in CLIENT_PARAMETERS:
            raise Refusal(Kind.INVALID, f"options.{name} is not an engine option", param=f"options.{name}")
    return dict(options)


def check_text(name: str, text: Union[str, None], max_input: int) -> None:
    """A text field (``input``, ``instructions``: the engine runs a model over either) within ``max_input``."""
    if text is not None and len(text) > max_input:
        raise Refusal(
            Kind.INVALID,
            f"{name} is {len(text)} characters; this server takes at most {max_input}",
            param=name,
            code="input_too_long",
        )


def speed_options(speed: float, options: Mapping[str, Any], facts: EngineFacts) -> dict[str, Any]:
    """``speed`` as the engine's declared option; refused with the range when it is out of it."""
    if speed == 1.0:
        return {}
    control = facts.speed
    if control is None:
        raise Refusal(Kind.INVALID, f"engine {facts.name!r} has no speed control; speed must be 1.0", param="speed")
    if control.option in options:
        raise Refusal(Kind.INVALID, f"give speed or options.{control.option}, not both", param="speed")
    value = control.value(speed)
    if value is None:
        low, high = control.speed_range()
        raise Refusal(
            Kind.INVALID,
            f"speed {speed:g} is outside engine {facts.name!r}'s range [{low:.3g}, {high:.3g}]",
            param="speed",
        )
    return {control.option: value}


#: Each field that asks for an emotion, and the kind it becomes (whose capability the engine needs).
_EMOTION_FIELDS: dict[str, type[Emotion]] = {
    "instructions": EmotionText,
    "emotion": EmotionVector,
    "emotion_reference": EmotionAudio,
}


async def _emotion(settings: SpeechSettings, facts: EngineFacts, voices: VoiceSources) -> Union[Emotion, None]:
    given = [name for name in _EMOTION_FIELDS if getattr(settings, name) is not None]
    if len(given) > 1:
        raise Refusal(
            Kind.INVALID, f"give one of instructions, emotion, emotion_reference, not {given}", param=given[1]
        )
    alpha = 1.0 if settings.emotion_strength is None else settings.emotion_strength
    if not given:
        if settings.emotion_strength is not None:
            raise Refusal(
                Kind.INVALID,
                "emotion_strength needs instructions, emotion or emotion_reference",
                param="emotion_strength",
            )
        return None
    (name,) = given
    capability, what = protocol.EMOTION_CAPABILITIES[_EMOTION_FIELDS[name]]
    if capability not in facts.capabilities:
        raise Refusal(Kind.INVALID, f"engine {facts.name!r} has no {what} ({name})", param=name, code="unsupported")
    if settings.instructions is not None:
        if not settings.instructions.strip():
            raise Refusal(Kind.INVALID, "instructions are empty", param="instructions")
        return EmotionText(text=settings.instructions, alpha=alpha)
    if settings.emotion is not None:
        unknown = sorted(set(settings.emotion) - set(EMOTION_NAMES))
        if unknown:
            raise Refusal(
                Kind.INVALID,
                f"unknown emotion {unknown[0][:32]!r}: the names are {', '.join(EMOTION_NAMES)}",
                param="emotion",
            )
        for emotion, weight in settings.emotion.items():
            if not (math.isfinite(weight) and 0.0 <= weight <= 1.0):
                raise Refusal(
                    Kind.INVALID, f"emotion.{emotion} must be in [0, 1], got {weight:g}", param=f"emotion.{emotion}"
                )
        return EmotionVector(**settings.emotion, alpha=alpha)
    assert settings.emotion_reference is not None
    reference = await voices.resolve(settings.emotion_reference, facts, param="emotion_reference")
    if not reference.is_clip or reference.value is None:
        raise Refusal(
            Kind.INVALID,
            "emotion_reference must name a voice with a clip (a clip or an uploaded voice)",
            param="emotion_reference",
        )
    return EmotionAudio(path=reference.value, alpha=alpha)


def _check_voice(voice: Resolved, facts: EngineFacts) -> None:
    if voice.is_clip and not facts.clones:
        raise Refusal(
            Kind.INVALID,
            f"engine {facts.name!r} cannot speak in a voice from a clip: name one of its own voices",
            param="voice",
            code="voice_clone_unsupported",
        )


async def prepare(
    settings: SpeechSettings,
    facts: EngineFacts,
    voices: VoiceSources,
    *,
    max_input: int,
    max_silence: float = DEFAULT_MAX_SILENCE,
) -> Prepared:
    """``settings`` as what the sidecar is asked for, checked in one order: voice, emotion,
    speed and engine options, sample rate; ``max_silence`` bounds an SSML text's breaks."""
    voice = await voices.resolve(settings.voice, facts)
    _check_voice(voice, facts)
    check_text("instructions", settings.instructions, max_input)
    emotion = await _emotion(settings, facts, voices)
    options = engine_options(settings.options)
    options.update(speed_options(settings.speed, options, facts))
    rate = settings.sample_rate or (PCM_RATE if settings.response_format == "pcm" else None)
    return Prepared(
        voice=voice.value,
        emotion=emotion,
        sample_rate=rate,
        options=options,
        response_format=settings.response_format,
        voice_source=voice.source,
        text_format=settings.text_format,
        max_silence=max_silence,
    )
