"""A msgpack skimmer: a message's ``op``, ``id`` and depth, read without decoding the rest.

So that a sidecar can answer a malformed request with an error that names its id, and
refuse deep nesting before a decoder recurses into it.  Iterative and bounded: neither
the nesting nor the number of items can cost more than a list of counts and a budget.
"""

from __future__ import annotations

from typing import NamedTuple, Union

from .messages import MAX_ID

__all__ = ["Peek", "kind_name", "peek"]


class Peek(NamedTuple):
    """What :func:`peek` could read of a message without decoding it."""

    #: Whether the body is a msgpack map (the rest may still be malformed).
    is_map: bool
    #: The top-level ``op`` when it is a valid string, else None.
    op: Union[str, None]
    #: Whether the map has an ``op`` key at all.
    has_op: bool
    #: The top-level ``id`` when it is a valid request id (0 ..= MAX_ID), else None.
    id: Union[int, None]
    #: The top-level ``id`` as found, valid or not (None when absent or not an int).
    raw_id: Union[int, None]
    #: The deepest nesting seen (the top-level map is 1), up to where reading stopped.
    depth: int


class _Malformed(Exception):
    pass


_FIXED = {  # msgpack type byte -> bytes that follow it (scalars of fixed size)
    0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
    0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,
}  # fmt: skip
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin and str: length bytes
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}  # ext: length bytes, then a type byte
_CONTAINER = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # length bytes, items per entry


def _header(data: memoryview, pos: int) -> tuple[int, int, int]:
    """One item's header at ``pos``: (kind, argument, position after the header).

    kind 0: a scalar, argument 0, the position is after the whole item; 1: a string
    of ``argument`` bytes that follow; 2: a container of ``argument`` items that follow
    (a map of n pairs counts 2n); 3: an integer whose value is the argument.
    """
    end = len(data)
    if pos >= end:
        raise _Malformed
    b = data[pos]
    pos += 1
    if b <= 0x7F:
        return 3, b, pos
    if b >= 0xE0:
        return 3, b - 0x100, pos
    if b <= 0x8F:
        return 2, 2 * (b & 0x0F), pos
    if b <= 0x9F:
        return 2, b & 0x0F, pos
    if b <= 0xBF:
        return 1, b & 0x1F, pos
    if 0xCC <= b <= 0xD3:
        size = _FIXED[b]
        if pos + size > end:
            raise _Malformed
        value = int.from_bytes(data[pos : pos + size], "big", signed=b >= 0xD0)
        return 3, value, pos + size
    if b in _FIXED:
        pos += _FIXED[b]
    elif b in _SIZED:
        size = _SIZED[b]
        if pos + size > end:
            raise _Malformed
        length = int.from_bytes(data[pos : pos + size], "big")
        if b >= 0xD9:
            return 1, length, pos + size
        pos += size + length
    elif b in _EXT:
        size = _EXT[b]
        if pos + size > end:
            raise _Malformed
        pos += size + 1 + int.from_bytes(data[pos : pos + size], "big")
    elif b in _CONTAINER:
        size, per = _CONTAINER[b]
        if pos + size > end:
            raise _Malformed
        return 2, per * int.from_bytes(data[pos : pos + size], "big"), pos + size
    else:  # 0xc1 is never used
        raise _Malformed
    if pos > end:
        raise _Malformed
    return 0, 0, pos


#: Items :func:`peek` reads at most (about 0.5 s of Python): a message of millions of
#: small items is not worth stalling the sidecar's event loop for.
_PEEK_BUDGET = 1_000_000


def _skip(data: memoryview, pos: int, level: int, budget: list[int]) -> tuple[int, int]:
    """Skip one item at nesting ``level``; return the position after it and the deepest level seen.

    Iterative: a message nested a million levels deep costs memory for a list of
    counts, never the interpreter's stack.  ``budget[0]`` counts down the items read.
    """
    remaining = [1]
    deepest = level
    while True:
        while remaining and remaining[-1] == 0:
            remaining.pop()
        if not remaining:
            return pos, deepest
        remaining[-1] -= 1
        budget[0] -= 1
        if budget[0] < 0:
            raise _Malformed
        kind, argument, pos = _header(data, pos)
        if kind == 1:
            pos += argument
            if pos > len(data):
                raise _Malformed
        elif kind == 2:
            remaining.append(argument)
            deepest = max(deepest, level + len(remaining) - 1)


def peek(body: Union[bytes, bytearray, memoryview]) -> Peek:
    """Read a message's top-level ``op`` and ``id`` and its depth, whatever else is wrong with it.

    Nothing but those two fields is decoded: the rest is skipped, so invalid UTF-8, an
    unhashable key or deep nesting elsewhere in the message cannot hide the request's id.
    Never raises; stops after a million items (what follows them is not read).
    """
    data = memoryview(body).cast("B") if isinstance(body, memoryview) else memoryview(body)
    op: Union[str, None] = None
    has_op = False
    raw_ids: list[Union[int, None]] = []
    depth = 0
    budget = [_PEEK_BUDGET]
    try:
        kind, count, pos = _header(data, 0)
        depth = 1
        if kind != 2 or data[0] in range(0x90, 0xA0) or data[0] in (0xDC, 0xDD):
            return Peek(False, None, False, None, None, depth)
        for _ in range(count // 2):
            kind, argument, after = _header(data, pos)
            key: Union[str, None] = None
            if kind == 1:
                try:
                    key = bytes(data[after : after + argument]).decode("utf-8")
                except UnicodeDecodeError:
                    key = None
                pos = after + argument
                if pos > len(data):
                    raise _Malformed
            else:
                pos, deepest = _skip(data, pos, 1, budget)
                depth = max(depth, deepest)
            if key in ("op", "id"):
                kind, argument, after = _header(data, pos)
                if key == "op":
                    has_op = True
                    op = None
                    if kind == 1:
                        try:
                            op = bytes(data[after : after + argument]).decode("utf-8")
                        except UnicodeDecodeError:
                            op = None
                else:
                    raw_ids.append(argument if kind == 3 else None)
            pos, deepest = _skip(data, pos, 1, budget)
            depth = max(depth, deepest)
    except _Malformed:
        pass
    raw_id = raw_ids[-1] if raw_ids else None  # the last one, as the decoder takes it
    valid = raw_id if raw_id is not None and 0 <= raw_id <= MAX_ID else None
    return Peek(depth >= 1, op, has_op, valid, raw_id, depth)


def kind_name(first: int) -> str:
    """The Python name of the msgpack type starting with byte ``first``."""
    if first <= 0x7F or first >= 0xE0 or 0xCC <= first <= 0xD3:
        return "int"
    if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD):
        return "list"
    if 0xA0 <= first <= 0xBF or 0xD9 <= first <= 0xDB:
        return "str"
    names = {0xC0: "NoneType", 0xC2: "bool", 0xC3: "bool", 0xCA: "float", 0xCB: "float"}
    return names.get(first, "bytes" if first in (0xC4, 0xC5, 0xC6) else "ext")
