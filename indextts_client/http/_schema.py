"""The body of ``POST /v1/audio/speech``: OpenAI's fields plus ours, on the service's shared fields."""

from __future__ import annotations

import re
from typing import Literal, Union

import msgspec

from .._service import FORMATS, Kind, Refusal, SpeechFields, SpeechSettings, check_depth, check_text

__all__ = ["DEFAULTS", "FORMATS", "SpeechRequest", "decode_speech", "param_of"]

#: What a body leaves out: OpenAI's defaults (``mp3``).
DEFAULTS = SpeechSettings(response_format="mp3")


class SpeechRequest(SpeechFields, kw_only=True, frozen=True):
    """OpenAI's ``/v1/audio/speech`` body; unknown fields are ignored, as OpenAI's clients may add some.

    The shared fields (``voice``, ``speed``, ``sample_rate``, ``options``, the emotion fields)
    are :class:`indextts_client._service.SpeechFields`'; :meth:`settings` fills in OpenAI's defaults.
    """

    input: str
    model: str = ""
    #: ``audio``: bytes as they are produced; ``sse``: OpenAI's events.  Unset: formats that
    #: stream as they are (mp3, opus, aac, pcm) stream, wav and flac come whole.
    stream_format: Union[Literal["audio", "sse"], None] = None

    def settings(self) -> SpeechSettings:
        return DEFAULTS.merged(self)


_AT = re.compile(r"at `\$\.([A-Za-z_][A-Za-z0-9_.]*)")
_MISSING = re.compile(r"missing required field `([A-Za-z_]+)`")


def param_of(message: str) -> Union[str, None]:
    """The field a msgspec error names, as the request spells it (``options.rate``, ``speed``)."""
    found = _AT.search(message) or _MISSING.search(message)
    return found.group(1) if found else None


def decode_speech(body: bytes, max_input: int) -> SpeechRequest:
    """The request in ``body``, or a :class:`Refusal` naming the field at fault."""
    check_depth(body)
    try:
        request = msgspec.json.decode(body, type=SpeechRequest)
    except msgspec.ValidationError as exc:
        raise Refusal(Kind.INVALID, f"invalid request: {exc}", param=param_of(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise Refusal(Kind.INVALID, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not request.input.strip():
        raise Refusal(Kind.INVALID, "input is empty", param="input")
    check_text("input", request.input, max_input)
    return request
