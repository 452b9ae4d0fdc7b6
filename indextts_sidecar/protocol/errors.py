"""What went wrong with a message, said so that its sender can act: the ``error`` frame for a
body that failed to decode, and the path of the field a validation error is about.
"""

from __future__ import annotations

import re
from typing import Union

import msgspec

from ._peek import kind_name, peek
from .messages import MAX_DEPTH, MAX_ID, REQUEST_OPS, Error

__all__ = ["describe_invalid", "field_of"]

_FIELD_RE = re.compile(r" - at `(\$[^`]*)`$")
_NAMED_RE = re.compile(r"(?:missing required|unknown) field `([^`]+)`")


def describe_invalid(body: Union[bytes, bytearray, memoryview], exc: BaseException) -> Error:
    """The ``error`` frame for a body that failed :func:`decode_request`.

    It names the offending field and carries the request id when one can be read, in
    which case it is that request's terminal frame.  ``exc`` is what decoding raised:
    a msgspec error, or ``RecursionError`` for a message nested too deep to decode.
    """
    peeked = peek(body)
    request_id = peeked.id
    if len(body) == 0:
        return Error(code="invalid_message", message="empty frame: a frame must hold one msgpack map")
    if not peeked.is_map:
        if peeked.depth == 0:
            return Error(code="invalid_message", message=f"frame is not valid msgpack: {exc}")
        return Error(
            code="invalid_message",
            message=f"a message must be a msgpack map with an 'op' field, got {kind_name(body[0])}",
            detail={"field": "$"},
        )
    if not peeked.has_op:
        return Error(
            code="invalid_message", id=request_id, message="message has no 'op' field", detail={"field": "$.op"}
        )
    op = peeked.op
    if op not in REQUEST_OPS:
        return Error(
            code="unknown_op",
            id=request_id,
            message=f"unknown op {op!r}; expected one of {sorted(REQUEST_OPS)}",
            detail={"field": "$.op", "op": op if op is not None else None},
        )
    if peeked.raw_id is not None and peeked.id is None:
        return Error(
            code="invalid_message",
            message=f"request id {peeked.raw_id} is outside 0..{MAX_ID}",
            detail={"field": "$.id"},
        )
    if isinstance(exc, RecursionError) or peeked.depth > MAX_DEPTH:
        return Error(
            code="invalid_message",
            id=request_id,
            message=f"invalid {op!r} message: nested {peeked.depth} levels deep, more than {MAX_DEPTH}",
            detail={"field": "$", "depth": peeked.depth},
        )
    if isinstance(exc, msgspec.ValidationError):
        return Error(
            code="invalid_message",
            id=request_id,
            message=f"invalid {op!r} message: {exc}",
            detail={"field": field_of(exc)},
        )
    return Error(code="invalid_message", id=request_id, message=f"invalid {op!r} message: not valid msgpack: {exc}")


def field_of(exc: msgspec.ValidationError, root: str = "$") -> str:
    """The path of the field a msgspec validation error is about, e.g. ``$.options.rate``."""
    text = str(exc)
    at = _FIELD_RE.search(text)
    path = at.group(1) if at else "$"
    named = _NAMED_RE.search(text)
    if named:
        path = f"{path}.{named.group(1)}"
    return root + path[1:]
