"""Emotion over HTTP: OpenAI's ``instructions`` and our extension fields, as the protocol's emotion.

- ``instructions`` (OpenAI's "how to say it") → :class:`EmotionText`: the engine derives the
  emotion from that description (IndexTTS-2 with its Qwen emotion model);
- ``emotion``: weights by name, ``{"happy": 0.6}`` → :class:`EmotionVector`;
- ``emotion_reference``: a voice (an uploaded voice's id or name, a clip of the voice
  directory, a ``--voice`` name) whose clip gives the emotion → :class:`EmotionAudio`;
- ``emotion_strength`` in [0, 1]: the ``alpha`` of any of them.

At most one of the first three.  Each needs its engine capability (``emotion_text``,
``emotion_vector``, ``emotion_audio``): an engine without it gets a 400 that says so, before
anything reaches a sidecar.  The values' own rules (ranges, sums, a reference that exists,
a loaded Qwen model) are the engine's, checked by the sidecar and answered as 400s naming
the field.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Protocol, Union

from indextts_sidecar.protocol import EMOTION_NAMES, Emotion, EmotionAudio, EmotionText, EmotionVector

from ._backends import EngineFacts
from ._errors import HTTPError

__all__ = ["EmotionFields", "emotion_for"]


class EmotionFields(Protocol):
    """The emotion fields of a request: the speech route's body, or a WebSocket context's settings."""

    @property
    def instructions(self) -> Union[str, None]: ...

    @property
    def emotion(self) -> Union[dict[str, float], None]: ...

    @property
    def emotion_reference(self) -> Union[str, None]: ...

    @property
    def emotion_strength(self) -> Union[float, None]: ...


_NEEDS = {
    "instructions": ("emotion_text", "emotion from a description"),
    "emotion": ("emotion_vector", "emotion weights"),
    "emotion_reference": ("emotion_audio", "emotion from a reference clip"),
}


async def emotion_for(
    request: EmotionFields, facts: EngineFacts, resolve: Callable[[str], Awaitable[Union[str, None]]]
) -> Union[Emotion, None]:
    """The protocol emotion ``request`` asks for, or None; 400 when it cannot be had here."""
    given = [name for name in _NEEDS if getattr(request, name) is not None]
    if len(given) > 1:
        raise HTTPError(400, f"give one of instructions, emotion, emotion_reference, not {given}", param=given[1])
    alpha = 1.0 if request.emotion_strength is None else request.emotion_strength
    if not given:
        if request.emotion_strength is not None:
            raise HTTPError(
                400, "emotion_strength needs instructions, emotion or emotion_reference", param="emotion_strength"
            )
        return None
    (field,) = given
    capability, what = _NEEDS[field]
    if capability not in facts.capabilities:
        raise HTTPError(400, f"engine {facts.name!r} has no {what} ({field})", param=field, code="unsupported")
    if request.instructions is not None:
        if not request.instructions.strip():
            raise HTTPError(400, "instructions are empty", param="instructions")
        return EmotionText(text=request.instructions, alpha=alpha)
    if request.emotion is not None:
        unknown = sorted(set(request.emotion) - set(EMOTION_NAMES))
        if unknown:
            raise HTTPError(
                400, f"unknown emotion {unknown[0][:32]!r}: the names are {', '.join(EMOTION_NAMES)}", param="emotion"
            )
        for name, weight in request.emotion.items():
            if not (math.isfinite(weight) and 0.0 <= weight <= 1.0):
                raise HTTPError(400, f"emotion.{name} must be in [0, 1], got {weight:g}", param=f"emotion.{name}")
        return EmotionVector(**request.emotion, alpha=alpha)
    assert request.emotion_reference is not None
    try:
        path = await resolve(request.emotion_reference)
    except HTTPError as exc:
        raise HTTPError(
            400, exc.message.replace("voice", "emotion_reference voice", 1), param="emotion_reference", code=exc.code
        ) from None
    if path is None:
        raise HTTPError(
            400, "emotion_reference must name a voice with a clip, not a default voice", param="emotion_reference"
        )
    return EmotionAudio(path=path, alpha=alpha)
