"""The body of ``POST /v1/audio/speech``: one msgspec struct, OpenAI's fields plus ours."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

import msgspec

from .._client import Client
from ._errors import HTTPError

__all__ = ["FORMATS", "SpeechRequest", "VoiceRef", "check_instructions", "decode_speech", "engine_options"]

#: OpenAI's response formats and their content types.
FORMATS = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}

Format = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


class VoiceRef(msgspec.Struct, frozen=True):
    """OpenAI's custom voice object: ``{"id": "voice_..."}``."""

    id: str


class SpeechRequest(msgspec.Struct, kw_only=True, frozen=True):
    """OpenAI's ``/v1/audio/speech`` body; unknown fields are ignored, as OpenAI's clients may add some."""

    input: str
    model: str = ""
    voice: Union[str, VoiceRef, None] = None
    response_format: Format = "mp3"
    #: OpenAI's range; the engine's own range (its speed declaration) is checked after.
    speed: Annotated[float, msgspec.Meta(ge=0.25, le=4.0)] = 1.0
    #: ``audio``: bytes as they are produced; ``sse``: OpenAI's events.  Unset: formats that
    #: stream as they are (mp3, opus, aac, pcm) stream, wav and flac come whole.
    stream_format: Union[Literal["audio", "sse"], None] = None
    #: OpenAI's style prompt for gpt-4o-mini-tts: emotion from this description, on engines
    #: that have it (:mod:`._emotion`).
    instructions: Union[str, None] = None
    #: Ours: resample to this rate (pcm is 24 kHz unless this is given).
    sample_rate: Union[Annotated[int, msgspec.Meta(ge=8000, le=48000)], None] = None
    #: Ours: the engine's request options (``temperature``...).
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    #: Ours (:mod:`._emotion`): emotion weights by name, ``{"happy": 0.6}``.
    emotion: Union[dict[str, float], None] = None
    #: Ours: a voice whose clip gives the emotion (an uploaded voice's id or name).
    emotion_reference: Union[str, None] = None
    #: Ours: how strongly the emotion applies (its ``alpha``).
    emotion_strength: Union[Annotated[float, msgspec.Meta(ge=0.0, le=1.0)], None] = None


_AT = re.compile(r"at `\$\.([A-Za-z_]+)")
_MISSING = re.compile(r"missing required field `([A-Za-z_]+)`")


def _param(message: str) -> Union[str, None]:
    found = _AT.search(message) or _MISSING.search(message)
    return found.group(1) if found else None


def decode_speech(body: bytes, max_input: int) -> SpeechRequest:
    """The request in ``body``, or an :class:`HTTPError` 400 naming the field at fault."""
    try:
        request = msgspec.json.decode(body, type=SpeechRequest)
    except msgspec.ValidationError as exc:
        raise HTTPError(400, f"invalid request: {exc}", param=_param(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise HTTPError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not request.input.strip():
        raise HTTPError(400, "input is empty", param="input")
    if len(request.input) > max_input:
        raise HTTPError(
            400,
            f"input is {len(request.input)} characters; this server takes at most {max_input}",
            param="input",
            code="input_too_long",
        )
    check_instructions(request.instructions, max_input)
    return request


def check_instructions(instructions: Union[str, None], max_input: int) -> None:
    """400 when ``instructions`` are longer than the input may be: the engine runs a model over
    them (IndexTTS-2's Qwen), so they have the same bound (the speech route and the WebSocket's)."""
    if instructions is not None and len(instructions) > max_input:
        raise HTTPError(
            400,
            f"instructions are {len(instructions)} characters; this server takes at most {max_input}",
            param="instructions",
            code="input_too_long",
        )


def _client_parameters() -> frozenset[str]:
    """The names the client's ``stream`` and ``stream_text`` take for themselves (``timeout``,
    ``voice``...): the request's engine options travel in the same keyword arguments."""
    names: set[str] = set()
    for method in (Client.stream, Client.stream_text):
        parameters = inspect.signature(method).parameters.values()
        names.update(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)
    return frozenset(names)


_CLIENT_PARAMETERS = _client_parameters()


def engine_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as the engine's request options, or a 400: a name the client takes itself
    would set the client's own argument (``timeout``, ``idle_timeout``: the server's bounds)."""
    for name in options:
        if name in _CLIENT_PARAMETERS:
            raise HTTPError(400, f"options.{name} is not an engine option", param=f"options.{name}")
    return dict(options)
