"""Word timings on their way out: held until the audio frame that holds a word's first sample.

An engine yields :class:`~.engines.Words` no later than the chunk that starts each word, and
may yield them well before (a sentence's words before its audio), while the sidecar cuts a
chunk into several frames and a resampler holds samples back.  :class:`PendingWords` keeps
a request's words until the frame whose samples reach a word's first one, so each
``audio`` frame carries exactly the words that start in it or before it (``Audio.words``),
and ``done`` the rest.
"""

from __future__ import annotations

from .engines import EngineError, Words
from .protocol import WordSpan

__all__ = ["PendingWords"]


class PendingWords:
    """Word timings of one request that no frame has carried yet, let out by position.

    :meth:`add` takes what the engine yielded (checked: a bad word is the engine's bug, an
    ``internal`` error); :meth:`due` hands over, in the order they came, the words whose
    first sample lies before a frame's end; :meth:`rest` the ones left for ``done``.
    """

    __slots__ = ("_held", "_text_length")

    def __init__(self, text_length: int) -> None:
        self._held: list[WordSpan] = []
        self._text_length = text_length

    def add(self, words: Words) -> None:
        for word in words.words:
            if not isinstance(word, WordSpan):
                raise EngineError(f"engine yielded Words holding {word!r}, not a WordSpan", code="internal")
            if not (0 <= word.start_char <= word.end_char <= self._text_length and 0 <= word.start <= word.end):
                raise EngineError(
                    f"engine yielded {word!r}: characters outside the text's {self._text_length} "
                    "or samples not 0 <= start <= end",
                    code="internal",
                )
        self._held.extend(words.words)

    def due(self, end: int) -> list[WordSpan]:
        """The words whose first sample is before sample ``end`` (of the request), now taken."""
        held = self._held
        if not held:
            return []
        due = [word for word in held if word.start < end]
        if due:
            self._held = [word for word in held if word.start >= end]
        return due

    def rest(self) -> list[WordSpan]:
        """The words no frame carried (their first sample lies past the audio), now taken."""
        rest, self._held = self._held, []
        return rest
