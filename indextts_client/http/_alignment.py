"""When each word is spoken, as the WebSocket route's ``audio.alignment`` event and the SSE
stream's ``speech.audio.alignment`` carry it (docs/serving.md).

One entry a word: its text, its start and end in seconds from the first sample of the sentence
(WebSocket) or of the response (SSE), and its character offsets into that sentence's text or
the request's ``input``; the offsets are null where the engine spoke its own text (IndexTTS's
segments, which stand in for the words it does not time: ``granularity`` ``segment``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .._audio import WordTiming
from .._socket_events import AlignedWord

__all__ = ["alignment_words"]


def alignment_words(words: Sequence[WordTiming]) -> list[AlignedWord]:
    """The words as the events' entries (seconds rounded to the microsecond)."""
    return [
        AlignedWord(
            word=word.word,
            start=round(word.start, 6),
            end=round(word.end, 6),
            char_start=None if word.span is None else word.span[0],
            char_end=None if word.span is None else word.span[1],
        )
        for word in words
    ]
