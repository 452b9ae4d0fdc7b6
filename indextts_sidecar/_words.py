"""Word timings on their way out: each on the audio frame that holds its first sample.

An engine yields :class:`~.engines.Words` no later than the chunk that starts each word, and
may yield them well before (a sentence's words before its audio), while the sidecar cuts a
chunk into several frames and a resampler holds samples back.  :class:`PendingWords` keeps
a request's words until the frame whose samples reach a word's first one, so each ``audio``
frame carries the words that start in it or before it that no frame carried yet
(``Audio.words``), and ``done`` the rest.

A frame has room for a bounded number of words (its ``--max-frame-size`` less its samples):
:func:`frames` ends a frame early, at the first sample of the first word that does not fit,
so that the rest ride on the frames after it, and no word waits past its own first sample.
"""

from __future__ import annotations

import bisect

from .engines import EngineError, Words
from .protocol import WordSpan

__all__ = ["WORD_BYTES", "PendingWords", "frames"]

#: Bytes of one word in a frame at most: a msgpack array of four integers below 2**64.
WORD_BYTES = 1 + 4 * 9
#: The largest sample or character position a word may name (so that it fits WORD_BYTES).
_MAX_POSITION = 2**63 - 1


def _start(word: WordSpan) -> int:
    return word.start


class PendingWords:
    """Word timings of one request that no frame has carried yet, ordered by first sample.

    :meth:`add` takes what the engine yielded (checked: a bad word is the engine's bug, an
    ``internal`` error); :meth:`take` hands over the words of one frame; :meth:`rest` the
    ones left for ``done``.
    """

    __slots__ = ("_held", "_text_length")

    def __init__(self, text_length: int) -> None:
        #: Sorted by ``start``; words of equal start keep the engine's order.
        self._held: list[WordSpan] = []
        self._text_length = text_length

    def __len__(self) -> int:
        return len(self._held)

    def add(self, words: Words) -> None:
        for word in words.words:
            if not isinstance(word, WordSpan):
                raise EngineError(f"engine yielded Words holding {word!r}, not a WordSpan", code="internal")
            if not (
                0 <= word.start_char <= word.end_char <= self._text_length
                and 0 <= word.start <= word.end <= _MAX_POSITION
            ):
                raise EngineError(
                    f"engine yielded {word!r}: characters outside the text's {self._text_length} "
                    "or samples not 0 <= start <= end",
                    code="internal",
                )
        held = self._held
        for word in words.words:
            if held and word.start < held[-1].start:
                bisect.insort_right(held, word, key=_start)
            else:
                held.append(word)

    def take(self, first: int, end: int, limit: int) -> tuple[list[WordSpan], int]:
        """The words of a frame that holds samples ``[first, end)`` of the request, now taken,
        and where that frame must end: ``end``, or earlier when more than ``limit`` words start
        before it (at the first sample of the first word left out, and after ``first``)."""
        held = self._held
        if not held or held[0].start >= end:
            return [], end
        due = bisect.bisect_left(held, end, key=_start)
        if due <= limit:
            taken = held[:due]
            del held[:due]
            return taken, end
        taken = held[:limit]
        del held[:limit]
        return taken, max(first + 1, min(end, held[0].start))

    def rest(self) -> list[WordSpan]:
        """The words no frame carried (their first sample lies past the audio), now taken."""
        rest, self._held = self._held, []
        return rest


def frames(
    pcm: memoryview, first: int, frame_bytes: int, pending: PendingWords, limit: int
) -> list[tuple[memoryview, list[WordSpan]]]:
    """``pcm`` (whole int16 samples, the request's from sample ``first`` on) cut into frames of
    at most ``frame_bytes`` bytes, each with its words (at most ``limit``).

    A list, not a generator: most chunks make one frame, and a list of one costs less."""
    cut = []
    offset = 0
    size = len(pcm)
    while offset < size:
        count = min(frame_bytes, size - offset) // 2
        words, end = pending.take(first, first + count, limit)
        piece = pcm[offset : offset + 2 * (end - first)]
        cut.append((piece, words))
        offset += len(piece)
        first = end
    return cut
