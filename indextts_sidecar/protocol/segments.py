"""Which text the audio that follows speaks: a ``synthesize`` progress frame whose ``message``
announces a segment, in one of two forms.

- ``text[START:END]``: the segment speaks those characters of the request's ``text``.  An
  engine that cuts its segments from the input as it is (espeak: one sentence a segment; the
  fake engine: the characters whose tones a chunk holds) says so with offsets, as Python
  slices the text (code points, ``END`` excluded), so the frame stays small whatever the
  text; the parent, which has the text, cuts the segment's words out of it.
- ``text: WORDS``: the segment speaks ``WORDS``, the engine's own text for it.  IndexTTS cuts
  its segments from the text as its normaliser rewrote it (numbers spelled out, punctuation
  mapped, its own case), which no offsets into the input describe, so it sends that text,
  at most :data:`MAX_SEGMENT_TEXT` characters of it.

The audio frames up to the next such message are that segment's.  The span the last message
named, named again (the fake engine names each chunk's), goes on with the same segment; each
``text: WORDS`` starts one, even with the words of the one before.  Where the sidecar
resamples, up to the converter's delay (a few milliseconds) of a segment's end arrives after
the next segment's message.
"""

from __future__ import annotations

import re
from typing import Union

__all__ = ["MAX_SEGMENT_TEXT", "read_segment", "segment_message", "segment_text_message", "segment_span"]

_SPAN = re.compile(r"text\[(\d{1,12}):(\d{1,12})\]")
_TEXT_PREFIX = "text: "

#: The longest segment text a ``text: WORDS`` message carries (a longer one is cut there).
MAX_SEGMENT_TEXT = 4096


def segment_message(start: int, end: int) -> str:
    """The progress message that announces the text span ``[start, end)``."""
    if not 0 <= start <= end:
        raise ValueError(f"a text span is 0 <= start <= end, not [{start}, {end})")
    return f"text[{start}:{end}]"


def segment_text_message(words: str) -> str:
    """The progress message that announces a segment speaking ``words`` (the engine's text)."""
    return _TEXT_PREFIX + words[:MAX_SEGMENT_TEXT]


def segment_span(message: str) -> Union[tuple[int, int], None]:
    """The span a progress message announces, or None when it announces none."""
    found = _SPAN.fullmatch(message)
    if found is None:
        return None
    start, end = int(found.group(1)), int(found.group(2))
    return (start, end) if start <= end else None


def read_segment(message: str) -> Union[tuple[int, int], str, None]:
    """The segment a progress message announces: its span of the request's text, or the
    engine's own words for it; None when the message announces no segment."""
    if message.startswith(_TEXT_PREFIX):
        return message[len(_TEXT_PREFIX) :]
    return segment_span(message)
