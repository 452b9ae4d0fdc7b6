"""Sentences cut out of streamed text, in time linear in the text.

The boundaries are ``sentence-stream``'s (:class:`SentenceBoundaryDetector`, the splitter
Home Assistant's own TTS servers use; extra ``[realtime]``), but that detector rescans
everything it holds for each boundary it finds, and holds any amount of text: 80 KB of
"A. A. ..." given to it at once costs minutes.  :class:`SentenceSplitter` keeps its cost
linear: it hands the detector at most :data:`PIECE` characters at a time, and as soon as
the text held waiting for a sentence end passes ``max_chars`` it cuts it itself, at the
last whitespace before the limit (the space between the two parts is dropped, never the
one after a word: a cut never glues two words together).  Each detector call then scans
at most ``max_chars + PIECE`` characters.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["PIECE", "SentenceSplitter"]

#: Characters handed to the detector at once.
PIECE: Final = 256
#: Where a forced cut may fall.
_SPACES: Final = (" ", "\n", "\t", "\r", "\u3000")


def _sentence_stream() -> Any:
    try:
        import sentence_stream
        import sentence_stream.util
    except ImportError as exc:
        raise ImportError(
            f"stream_text needs the sentence splitter of the [realtime] extra: pip install sentence-stream ({exc})"
        ) from None
    return sentence_stream


def _cut_point(text: str, limit: int) -> int:
    """Where to cut ``text`` so that its head has at most ``limit`` characters: at the last
    whitespace within them (which neither part keeps), else at the limit itself."""
    index = max(text.rfind(space, 1, limit + 1) for space in _SPACES)
    return index if index > 0 else limit


def _bounded(sentence: str, limit: int) -> list[str]:
    """``sentence`` in parts of at most ``limit`` characters, cut at spaces where there are any."""
    parts = []
    while len(sentence) > limit:
        cut = _cut_point(sentence, limit)
        parts.append(sentence[:cut].rstrip())
        sentence = sentence[cut:].lstrip()
    parts.append(sentence)
    return parts


class SentenceSplitter:
    """Text in (any fragments), sentences out; at most ``max_chars`` held waiting for an end.

    Plain synchronous code (no I/O): a caller on an event loop runs large fragments in a
    worker thread.  Not thread-safe: one caller at a time.
    """

    def __init__(self, max_chars: int) -> None:
        if max_chars < 1:
            raise ValueError("max_chars must be >= 1")
        library = _sentence_stream()
        self._detector = library.SentenceBoundaryDetector()
        self._clean = library.util.remove_asterisks
        self._max = max_chars

    @property
    def pending(self) -> int:
        """Characters held waiting for a sentence end."""
        return len(self._detector.current_sentence) + len(self._detector.remaining_text)

    def add(self, text: str) -> list[str]:
        """The sentences ``text`` completes, in order (some may be forced cuts of long text)."""
        sentences: list[str] = []
        for start in range(0, len(text), PIECE):
            for sentence in self._detector.add_chunk(text[start : start + PIECE]):
                # Held text is cut at max_chars, but a piece may complete a longer sentence.
                sentences.extend(_bounded(sentence, self._max))
            while self.pending > self._max:
                sentences.append(self._cut())
        return sentences

    def finish(self) -> str:
        """What is held, sentence end or not (the end of a turn); the splitter starts afresh."""
        text: str = self._detector.finish()  # at most max_chars: add() cut what was longer
        return text

    def _cut(self) -> str:
        """The first ``max_chars`` held, cut at a space; the rest stays held, unscanned again.

        The detector holds two strings: ``current_sentence`` (sentences that may yet turn out
        to end in an abbreviation) and ``remaining_text`` (text it found no boundary in).
        """
        detector = self._detector
        current: str = detector.current_sentence
        remaining: str = detector.remaining_text
        held = current + remaining
        cut = _cut_point(held, self._max)
        head, tail = held[:cut], held[cut:].lstrip()
        if cut < len(current):
            # Cut inside the sentences held for an abbreviation: the rest of them stays there.
            detector.current_sentence = current[cut:].lstrip()
            if not detector.current_sentence:
                detector.remaining_text = remaining.lstrip()
        else:
            detector.current_sentence = ""
            detector.remaining_text = tail
        result: str = self._clean(head.strip())
        return result
