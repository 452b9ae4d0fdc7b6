"""Which part of the request's text the audio that follows speaks: a ``synthesize`` progress
frame whose ``message`` is ``text[START:END]``.

An engine that knows its segments' text (espeak: one sentence a segment; the fake engine:
the characters whose tones a chunk holds) reports each segment's span with the
``synthesize`` progress it sends before the segment's audio.  ``START`` and ``END`` are
offsets into the request's ``text`` as Python slices it (code points, ``END`` excluded),
so the frame stays small whatever the text; the parent, which has the text, cuts the
segment's words out of it.  The audio frames up to the next such message are that span's
(where the sidecar resamples, up to the converter's delay, a few milliseconds, of a
segment's end arrives after the next segment's message).
"""

from __future__ import annotations

import re
from typing import Union

__all__ = ["segment_message", "segment_span"]

_SPAN = re.compile(r"text\[(\d{1,12}):(\d{1,12})\]")


def segment_message(start: int, end: int) -> str:
    """The progress message that announces the text span ``[start, end)``."""
    if not 0 <= start <= end:
        raise ValueError(f"a text span is 0 <= start <= end, not [{start}, {end})")
    return f"text[{start}:{end}]"


def segment_span(message: str) -> Union[tuple[int, int], None]:
    """The span a progress message announces, or None when it announces none."""
    found = _SPAN.fullmatch(message)
    if found is None:
        return None
    start, end = int(found.group(1)), int(found.group(2))
    return (start, end) if start <= end else None
