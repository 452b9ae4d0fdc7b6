"""A bound on JSON nesting, checked on the raw text before any decoder sees it.

msgspec's own limit differs by Python version (it decodes 1,000 levels on 3.13) and a deep
enough document exhausts the C stack or raises ``RecursionError`` in a decoder; checking the
text first refuses the same documents the same way on every front end and every Python.
"""

from __future__ import annotations

import re
from typing import Union

from .refusal import Kind, Refusal

__all__ = ["MAX_DEPTH", "check_depth", "depth_of"]

#: The deepest nesting of arrays and objects a request or event may have.
MAX_DEPTH = 64

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")
_OPEN = frozenset(b"[{")


def depth_of(data: Union[bytes, str], limit: int = MAX_DEPTH) -> int:
    """The nesting depth of the JSON text ``data`` (strings are skipped), counted up to one past
    ``limit``: linear in the text, and it stops reading once past the limit."""
    raw = data.encode() if isinstance(data, str) else data
    if b"[" not in raw and b"{" not in raw:
        return 0
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRINGS.sub(b'""', raw)):
        if match.group()[0] in _OPEN:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def check_depth(data: Union[bytes, str], limit: int = MAX_DEPTH) -> None:
    """A :class:`Refusal` (``too_deep``) when ``data`` nests deeper than ``limit``."""
    if depth_of(data, limit) > limit:
        raise Refusal(Kind.INVALID, f"the JSON nests deeper than {limit} levels", code="too_deep")
