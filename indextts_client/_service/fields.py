"""The request fields every front end shares, with their bounds said once.

:class:`SpeechFields` is what a request *gives* (a field it leaves out is ``UNSET``): the HTTP
body and the WebSocket's ``session.config``/``context.config`` events are this struct plus their
own fields.  :class:`SpeechSettings` is what a request *means* once the front end's defaults
fill in what it left out (:meth:`SpeechSettings.merged`); :func:`~.prepare.prepare` takes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Union

import msgspec

__all__ = [
    "FORMATS",
    "Format",
    "SampleRate",
    "Speed",
    "SpeechFields",
    "SpeechSettings",
    "Strength",
    "VoiceRef",
]

#: Audio formats and their content types (OpenAI's names).
FORMATS = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
Format = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
#: OpenAI's speed range; the engine's own range (its speed control) is checked after.
Speed = Annotated[float, msgspec.Meta(ge=0.25, le=4.0)]
#: Resample to this rate.
SampleRate = Annotated[int, msgspec.Meta(ge=8000, le=48000)]
#: How strongly an emotion applies (its ``alpha``).
Strength = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
TextFormat = Literal["text", "ssml"]


class VoiceRef(msgspec.Struct, frozen=True):
    """OpenAI's custom voice object: ``{"id": "voice_..."}``."""

    id: str


_Unset = msgspec.UnsetType
UNSET: Any = msgspec.UNSET


class SpeechFields(msgspec.Struct, kw_only=True, frozen=True):
    """The shared fields as a request gives them; unknown fields are the front end's business."""

    voice: Union[str, VoiceRef, _Unset, None] = UNSET
    response_format: Union[Format, _Unset] = UNSET
    speed: Union[Speed, _Unset] = UNSET
    #: Resample to this rate (pcm is 24 kHz unless this is given).
    sample_rate: Union[SampleRate, _Unset, None] = UNSET
    #: The engine's request options (``temperature``...): a mapping all the way to the sidecar.
    options: Union[dict[str, Any], _Unset] = UNSET
    #: OpenAI's style prompt: emotion from this description, on engines that have it.
    instructions: Union[str, _Unset, None] = UNSET
    #: Emotion weights by name, ``{"happy": 0.6}``.
    emotion: Union[dict[str, float], _Unset, None] = UNSET
    #: A voice whose clip gives the emotion (an uploaded voice's id or name...).
    emotion_reference: Union[str, _Unset, None] = UNSET
    emotion_strength: Union[Strength, _Unset, None] = UNSET
    #: How the text is read: as it is, or as SSML (the client's ``text_format``; docs/client.md#ssml).
    text_format: Union[TextFormat, _Unset] = UNSET


SHARED_FIELDS = tuple(SpeechFields.__struct_fields__)


@dataclass(frozen=True)
class SpeechSettings:
    """The shared fields, whole: what a request gave, else a front end's defaults."""

    voice: Union[str, None] = None
    response_format: str = "mp3"
    speed: float = 1.0
    sample_rate: Union[int, None] = None
    options: Mapping[str, Any] = field(default_factory=dict)
    instructions: Union[str, None] = None
    emotion: Union[Mapping[str, float], None] = None
    emotion_reference: Union[str, None] = None
    emotion_strength: Union[float, None] = None
    text_format: str = "text"

    def merged(self, given: SpeechFields) -> SpeechSettings:
        """These settings with what ``given`` sets in their place."""
        values: dict[str, Any] = {}
        for name in SHARED_FIELDS:
            value = getattr(given, name)
            if value is UNSET:
                continue
            values[name] = value.id if isinstance(value, VoiceRef) else value
        return replace(self, **values)
