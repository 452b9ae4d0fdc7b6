"""Messages to bytes and back: msgpack bodies, length-prefixed frames, ``audio`` frames without a copy.

One encoder and one typed decoder per direction, made once: msgspec's decoders are
cheapest when reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Union

import msgspec

from .messages import MAX_DEPTH, Audio, Reply, Request, Synthesize, WordSpan

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "HEADER",
    "MIN_MAX_FRAME_SIZE",
    "audio_frame_parts",
    "decode_reply",
    "decode_request",
    "encode",
    "frame",
    "nests_deeper",
]

#: Size of the length prefix in bytes.
HEADER: Final = 4
#: Largest frame either side accepts unless configured otherwise (16 MiB).
DEFAULT_MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
#: The smallest limit a sidecar may be configured with; every control message fits.
MIN_MAX_FRAME_SIZE: Final = 64 * 1024

_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_EMPTY = memoryview(b"")


def encode(message: Union[Request, Reply]) -> bytes:
    """The msgpack body of ``message``, without the length prefix."""
    return _encoder.encode(message)


def frame(message: Union[Request, Reply]) -> bytes:
    """``message`` as a complete frame: length prefix and body."""
    body = _encoder.encode(message)
    return len(body).to_bytes(HEADER, "big") + body


def audio_frame_parts(
    request_id: int, seq: int, sample_rate: int, pcm: memoryview, words: Sequence[WordSpan] = ()
) -> tuple[bytes, memoryview]:
    """An ``audio`` frame as (everything before the samples, the samples themselves).

    Written one after the other (``os.writev``), the two parts form one ``audio`` frame
    whose samples were never copied into an encode buffer: ``pcm`` is the last field of
    ``Audio``, so the frame ends with a msgpack ``bin 32`` header and the raw bytes.
    """
    head = _encoder.encode(Audio(id=request_id, seq=seq, sample_rate=sample_rate, words=list(words), pcm=_EMPTY))
    # ``head`` ends with the empty bin (c4 00); swap in a bin 32 header for the real length.
    size = len(pcm)
    body_size = len(head) - 2 + 5 + size
    return (
        body_size.to_bytes(HEADER, "big") + head[:-2] + b"\xc6" + size.to_bytes(4, "big"),
        pcm,
    )


def decode_request(body: Union[bytes, bytearray, memoryview]) -> Request:
    """Decode a frame body sent by a parent; raises ``msgspec.DecodeError`` or ``ValidationError``.

    A request nested deeper than :data:`MAX_DEPTH` is refused here (``ValidationError``), the
    same on every Python: msgspec's own limit follows the interpreter's (on 3.13 it decodes
    thousands of levels), and engine options are the one place a request can nest freely.
    """
    request = _request_decoder.decode(body)
    if type(request) is Synthesize and request.options:
        for value in request.options.values():
            # Options are mostly scalars: only a container (msgpack decodes to dict and list)
            # can nest, so the walk runs only then.
            if type(value) is dict or type(value) is list:
                if nests_deeper(request.options, MAX_DEPTH - 1):
                    raise msgspec.ValidationError(f"the message nests deeper than {MAX_DEPTH} levels - at `$.options`")
                break
    return request


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether decoded msgpack ``value`` (itself level 1) nests more than ``limit`` levels; iterative."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            return True
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return False


def decode_reply(body: Union[bytes, bytearray, memoryview]) -> Reply:
    """Decode a frame body sent by a sidecar.  ``Audio.pcm`` views into ``body`` without copying."""
    return _reply_decoder.decode(body)
