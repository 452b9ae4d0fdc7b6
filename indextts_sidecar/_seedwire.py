"""``--wire seed``: the wire of the one-file sidecar this project grew from.

Each frame is a 4-byte big-endian length and a UTF-8 JSON object with an ``op``; there are
no request ids, so the parent sends one request at a time and tells replies apart by their
order.  The sidecar says ``ready`` (``engine``, ``sample_rate``); ``ping`` is answered
``pong`` (``vram_mb``); ``synthesize`` (``text``, ``ref_audio``, ``emo_vector``,
``emo_audio``, ``emo_text``, ``emo_alpha``, ``use_random``...) by ``progress`` frames
(``stage``, ``percent``) and then one ``audio`` frame holding all of the request's samples
(``audio_pcm_b64``: base64 little-endian int16, ``sample_rate``, ``n_samples``), or an
``error`` (``stage``, ``message``); ``shutdown`` ends the sidecar with exit status 0.

This module only translates: the server behind it is the same as protocol v1's, so a seed
parent gets that server's checks, its path policy and its stdout protection.  Errors keep
the seed's ``stage`` and ``message`` and add our ``code`` (and ``field``); their messages
carry no tracebacks and no absolute paths.  docs/protocol.md, "The seed's wire", lists
what differs from the seed.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Sequence
from typing import Annotated, Any, Union

import msgspec

from . import protocol
from ._jobs import AUDIO_FRAME_OVERHEAD
from ._wire import InvalidRequest
from .engines import RequestError
from .protocol import (
    EMOTION_NAMES,
    MAX_DEPTH,
    Done,
    EmotionAudio,
    EmotionText,
    EmotionVector,
    Error,
    Ok,
    Ping,
    Pong,
    Progress,
    Ready,
    Shutdown,
    Synthesize,
    nests_deeper,
)

__all__ = ["SEED_MAX_FRAME_SIZE", "SeedWire"]

log = logging.getLogger("indextts_sidecar")

#: The seed's own frame limit (its ``MAX_FRAME_BYTES``, which its parent shares): the default
#: ``--max-frame-size`` on this wire, so that a request's audio may be as long as the seed's.
SEED_MAX_FRAME_SIZE = 64 * 1024 * 1024
#: The ops a seed parent sends.
SEED_OPS = ("ping", "synthesize", "shutdown")
#: Characters of an unknown ``op`` echoed in the error (the seed echoed it whole).
_ECHO_CHARS = 80
#: An absolute path in a message: replaced, never shown.  Our messages quote paths with
#: ``repr()`` (single quotes, or double quotes when the path holds a single quote, with
#: backslash escapes), so a quoted path is taken whole, spaces and quotes included; a bare
#: path ends at a space or punctuation.
_ABSOLUTE_PATH = re.compile(r"""'/(?:[^'\\]|\\.)*'|"/(?:[^"\\]|\\.)*"|(?<![\w/.])/[^\s'",;()]+""")
#: Our error codes by the seed stage they are reported under, where no request is known.
_RECV_CODES = frozenset({"frame_too_large", "truncated_frame", "invalid_message"})
#: Seed fields the seed's parent may send that no engine here takes: logged and not used.
_UNUSED_FIELDS = ("duration", "target_tokens")


class _SeedMessage(msgspec.Struct, tag_field="op", kw_only=True):
    """Base of the seed's requests: unknown fields are ignored, as the seed ignored them."""


class _SeedPing(_SeedMessage, tag="ping"):
    pass


class _SeedShutdown(_SeedMessage, tag="shutdown"):
    pass


class _SeedSynthesize(_SeedMessage, tag="synthesize"):
    text: str
    #: The speaker reference clip (a path): our ``voice``.
    ref_audio: Union[str, None] = None
    #: Eight weights, in IndexTTS-2's order (happy, angry, sad, afraid, disgusted, melancholic, surprised, calm).
    emo_vector: Union[Annotated[list[float], msgspec.Meta(min_length=8, max_length=8)], None] = None
    #: A second clip to take the emotion from; ``emo_audio_prompt`` is the name the seed forwarded upstream.
    emo_audio: Union[str, None] = None
    emo_audio_prompt: Union[str, None] = None
    emo_text: Union[str, None] = None
    use_emo_text: Union[bool, None] = None
    emo_alpha: Union[float, None] = None
    use_random: Union[bool, None] = None
    duration: Union[float, None] = None
    target_tokens: Union[int, None] = None
    #: Not the seed's: engine request options as protocol v1's ``options`` (e.g. the fake engine's).
    options: dict[str, Any] = msgspec.field(default_factory=dict)


_SeedRequest = Union[_SeedPing, _SeedShutdown, _SeedSynthesize]


def _emotion(seed: _SeedSynthesize) -> Union[protocol.Emotion, None]:
    """The seed's emotion fields as one emotion, in IndexTTS-2's precedence: text, then vector, then audio."""
    alpha = 1.0 if seed.emo_alpha is None else seed.emo_alpha
    if seed.use_emo_text or (seed.use_emo_text is None and seed.emo_text is not None):
        return EmotionText(text=seed.emo_text, alpha=alpha)
    if seed.emo_vector is not None:
        return EmotionVector(**dict(zip(EMOTION_NAMES, seed.emo_vector, strict=True)), alpha=alpha)
    path = seed.emo_audio if seed.emo_audio is not None else seed.emo_audio_prompt
    if path is not None:
        return EmotionAudio(path=path, alpha=alpha)
    return None


def _without_paths(message: str) -> str:
    return _ABSOLUTE_PATH.sub(lambda match: "'<path>'" if match[0][0] in "'\"" else "<path>", message)


def _stage_of(error: Error) -> str:
    """The seed's ``stage`` for an error: where it arose."""
    stage = error.detail.get("stage")
    if isinstance(stage, str):
        return stage
    if error.id is not None:
        return "synthesize"  # the one request of this wire that runs a job
    return "recv" if error.code in _RECV_CODES else "dispatch"


def _json_frame(body: dict[str, Any]) -> tuple[bytes]:
    data = msgspec.json.encode(body)
    return (len(data).to_bytes(protocol.HEADER, "big") + data,)


class SeedWire:
    """The seed's length-prefixed JSON, for one connection (it numbers the requests and holds their audio)."""

    name = "seed"
    one_at_a_time = True

    def __init__(self, max_frame_size: int = SEED_MAX_FRAME_SIZE) -> None:
        #: PCM bytes one ``audio`` frame can carry: base64 takes 4 bytes per 3.
        self.max_audio_bytes = max(0, max_frame_size - AUDIO_FRAME_OVERHEAD) // 4 * 3 // 2 * 2
        self._last_id = 0
        #: The samples of the request running (one at a time), until its terminal frame.
        self._audio: dict[int, bytearray] = {}
        self._warned: set[str] = set()

    # ------------------------------------------------------------ requests

    def decode(self, body: memoryview) -> protocol.Request:
        try:
            message = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise InvalidRequest(Error(code="invalid_message", message=f"the frame is not JSON: {exc}")) from None
        op = message.get("op") if isinstance(message, dict) else None
        if op not in SEED_OPS:
            shown = repr(op)
            if len(shown) > _ECHO_CHARS:
                shown = shown[:_ECHO_CHARS] + "..."
            raise InvalidRequest(Error(code="unknown_op", message=f"unknown op: {shown}", detail={"stage": "dispatch"}))
        try:
            seed: _SeedRequest = msgspec.convert(message, _SeedRequest)
        except msgspec.ValidationError as exc:
            field = protocol.field_of(exc, "$")
            error = Error(code="invalid_message", message=f"{op}: {exc}", detail={"stage": op, "field": field})
            raise InvalidRequest(error) from None
        if isinstance(seed, _SeedSynthesize) and seed.options and nests_deeper(seed.options, MAX_DEPTH - 1):
            # The same bound as our own wire's, on every Python (msgspec's JSON limit follows the
            # interpreter's: 3.13 decodes a thousand levels), before any engine sees the options.
            message = f"synthesize: the message nests deeper than {MAX_DEPTH} levels - at `$.options`"
            error = Error(code="invalid_message", message=message, detail={"stage": "synthesize", "field": "$.options"})
            raise InvalidRequest(error)
        self._last_id += 1
        request_id = self._last_id
        match seed:
            case _SeedPing():
                return Ping(id=request_id)
            case _SeedShutdown():
                return Shutdown(id=request_id)
            case _SeedSynthesize():
                return self._synthesize(request_id, seed)
        raise AssertionError(seed)  # pragma: no cover - the union is exhausted above

    def _synthesize(self, request_id: int, seed: _SeedSynthesize) -> Synthesize:
        for name in _UNUSED_FIELDS:
            if getattr(seed, name) is not None and name not in self._warned:
                self._warned.add(name)
                log.warning("seed wire: %r is not used by this sidecar's engines; requests are served without it", name)
        options = dict(seed.options)
        if seed.use_random:  # False is every engine's default: sent only when asked for
            options["use_random"] = True
        return Synthesize(id=request_id, text=seed.text, voice=seed.ref_audio, emotion=_emotion(seed), options=options)

    # ------------------------------------------------------------- replies

    def encode(self, reply: protocol.Reply) -> Union[tuple[bytes], None]:
        match reply:
            case Ready(engine=engine, sample_rate=rate):
                return _json_frame({"op": "ready", "engine": engine, "sample_rate": rate})
            case Pong(memory=memory):
                device = memory.get("cuda_allocated", memory.get("mps_allocated", 0))
                return _json_frame({"op": "pong", "vram_mb": round(device / (1024 * 1024), 1)})
            case Progress(stage=stage, fraction=fraction):
                if fraction is None:  # the seed's progress always has a percentage
                    return None
                stage = "loading_model" if stage == "load" else stage
                return _json_frame({"op": "progress", "stage": stage, "percent": round(fraction * 100)})
            case Done(id=request_id, samples=samples, sample_rate=rate):
                pcm = self._audio.pop(request_id, b"")
                b64 = base64.b64encode(pcm).decode("ascii")
                return _json_frame({"op": "audio", "audio_pcm_b64": b64, "sample_rate": rate, "n_samples": samples})
            case Error():
                return self._error(reply)
            case Ok():  # the answer to shutdown: the seed says nothing and exits
                return None
        return None  # pragma: no cover - the seed has no frame for any other reply

    def _error(self, error: Error) -> Union[tuple[bytes], None]:
        if error.id is not None:
            self._audio.pop(error.id, None)
        elif error.code == "shutting_down":
            return None  # the end of input: the seed ends silently, and nothing was pending
        frame: dict[str, Any] = {
            "op": "error",
            "stage": _stage_of(error),
            "code": error.code,
            # The seed's own words for an unknown op; our code in front of every other message.
            "message": error.message
            if error.code == "unknown_op"
            else f"{error.code}: {_without_paths(error.message)}",
        }
        field = error.detail.get("field")
        if isinstance(field, str):
            frame["field"] = field
        return _json_frame(frame)

    def audio(
        self, request_id: int, seq: int, sample_rate: int, pcm: memoryview, words: Sequence[protocol.WordSpan] = ()
    ) -> None:
        """Keep the chunk for the request's one ``audio`` frame; refuse past what that frame can carry.

        ``words`` are dropped: the seed's ``audio`` frame has no field for word timings (nor
        does its ``done``, which :meth:`encode` turns into that frame).
        """
        held = self._audio.setdefault(request_id, bytearray())
        if len(held) + len(pcm) > self.max_audio_bytes:
            self._audio.pop(request_id, None)
            raise RequestError(
                f"the audio is longer than one frame of this wire carries ({self.max_audio_bytes} bytes of samples; "
                "--max-frame-size)",
                field="$.text",
            )
        held += pcm
