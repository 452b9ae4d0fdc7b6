"""The text of each segment upstream speaks, as upstream's own segmenter cut it.

Upstream cuts a request's text into segments inside its generator, after its normaliser has
rewritten the text (numbers spelled out, punctuation mapped, IndexTTS-2 upper-cases), so
neither the segments nor their words can be worked out from the input alone.  What the
segmenter returns can be observed: :class:`SegmentTexts` puts a wrapper on the loaded model
instance, in front of the segmenter every flavour calls,

- IndexTTS-2.5 (the GitHub checkout and ``indextts25``): ``model.split_text_by_tokens(text,
  max_tokens, lang_prefix)``, which returns the normalised text of each segment;
- IndexTTS-2 (the GitHub checkout and ``indextts2-inference``):
  ``model.tokenizer.split_segments(tokens, max_tokens, quick_streaming_tokens=...)``, which
  returns each segment's sentencepiece pieces,

that hands the segmenter's result back and keeps its text.  Upstream's code and class are
untouched: the wrapper is an attribute of the one instance.  Where neither segmenter exists
(another upstream version), nothing is wrapped and segments carry no text.

With a first-segment length (the ``first_segment_tokens`` option, :meth:`SegmentTexts.start`),
the wrapper also cuts the first segment short, so that a stream's first audio waits for a few
words rather than a sentence: upstream's own segmenter cuts the first segment again at that
many text tokens (at punctuation where it can), the cut is moved back to the word boundary
before it when it falls inside a word, and what follows the cut stays one segment, as it was.
A request that streams (``synthesize.stream``) and sets no length, with no engine default, gets
:data:`STREAM_FIRST_SEGMENT_TOKENS`.  (Upstream's own knobs do not do it everywhere: the GitHub
checkout's ``split_segments`` takes ``quick_streaming_tokens`` and never reads it, and 2.5's
segmenter has no such parameter.)
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable
from typing import Any, Union

__all__ = ["STREAM_FIRST_SEGMENT_TOKENS", "SegmentTexts", "first_length", "pieces_text"]

log = logging.getLogger("indextts_sidecar.engines.indextts")

#: Sentencepiece's word-boundary mark.
_WORD_MARK = "\u2581"
#: Characters written without spaces between them (upstream spaces them out for its tokenizer).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_GAP = re.compile(f"(?<=[{_CJK}]) (?=[{_CJK}])")
_SPACES = re.compile(r"\s+")
#: The first segment of a streaming request (``synthesize.stream``) that neither the request nor
#: the engine options cut: 10 text tokens.  The real tokenizers' pieces are a word or part of one
#: (a CJK character), so that is a few words, where upstream's first segment runs up to 120 tokens,
#: a sentence or more.  (The tiny test fixtures' tokenizers: about a word a token with 2's, a
#: character with 2.5's.)
STREAM_FIRST_SEGMENT_TOKENS = 10


def pieces_text(pieces: Any) -> str:
    """The text of a segment's sentencepiece pieces: word marks as spaces, none between CJK characters."""
    joined = "".join(str(piece) for piece in pieces).replace(_WORD_MARK, " ")
    return _CJK_GAP.sub("", _SPACES.sub(" ", joined).strip())


def first_length(request_options: Any, engine_options: Any, stream: bool = False) -> Union[int, None]:
    """A request's ``first_segment_tokens``: its own option, else the engine's, else
    :data:`STREAM_FIRST_SEGMENT_TOKENS` when it streams; None (an explicit 0 too): upstream's segments."""
    value = getattr(request_options, "first_segment_tokens", None)
    if value is None:
        value = getattr(engine_options, "first_segment_tokens", None)
    if value is None and stream:
        value = STREAM_FIRST_SEGMENT_TOKENS
    return int(value) if value else None


def _plain_text(segment: Any) -> str:
    return _SPACES.sub(" ", str(segment)).strip()


class SegmentTexts:
    """The texts of the segments upstream cut the current request into, in order."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        #: The current request's first-segment length in text tokens (None: upstream's segments).
        self.first_tokens: Union[int, None] = None

    def start(self, first_tokens: Union[int, None] = None) -> None:
        """Forget the last request's segments (call before each request); ``first_tokens``: cut
        the first segment at that many text tokens (None or 0: as upstream cuts it)."""
        self.texts = []
        self.first_tokens = first_tokens or None

    def text(self, index: int) -> Union[str, None]:
        """The text of segment ``index`` (0-based), or None when upstream's segmenter gave none."""
        return self.texts[index] if 0 <= index < len(self.texts) else None

    def install(self, model: Any) -> bool:
        """Observe ``model``'s segmenter; False when it has neither known one."""
        split = getattr(model, "split_text_by_tokens", None)
        if callable(split):
            model.split_text_by_tokens = self._recording(split, _plain_text)
            return True
        tokenizer: Any = getattr(model, "tokenizer", None)
        split = getattr(tokenizer, "split_segments", None)
        if callable(split):
            tokenizer.split_segments = self._recording(split, pieces_text)
            return True
        log.info("this upstream has no known segmenter: segments carry no text")
        return False

    def _recording(self, split: Callable[..., Any], text_of: Callable[[Any], str]) -> Callable[..., Any]:
        def recording(*args: Any, **kwargs: Any) -> Any:
            segments = split(*args, **kwargs)
            if self.first_tokens is not None and isinstance(segments, list) and len(args) >= 2:
                segments = self._first_short(split, segments, args, kwargs)
            if isinstance(segments, (list, tuple)):  # upstream's are lists: never consume an iterator
                try:
                    self.texts.extend([text_of(segment) for segment in segments])
                except Exception as exc:  # the text is a nicety: never let it fail the request
                    log.warning("could not read the segments' text: %s: %s", type(exc).__name__, exc)
            return segments

        recording.__wrapped__ = split  # type: ignore[attr-defined]
        return recording

    def _first_short(
        self, split: Callable[..., Any], segments: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[Any]:
        """``segments`` with the first one cut at ``first_tokens`` (a word boundary), the rest of it one segment."""
        first = segments[0] if segments else None
        if not isinstance(first, (list, str)) or self.first_tokens is None:
            return segments
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # 2's segmenter warns when it cuts by length
                parts = split(first, self.first_tokens, *args[2:], **kwargs)
        except Exception as exc:  # the cut is a nicety: never let it fail the request
            log.warning("could not cut the first segment short: %s: %s", type(exc).__name__, exc)
            return segments
        if not isinstance(parts, list) or len(parts) < 2 or not isinstance(parts[0], type(first)):
            return segments
        cut = _word_boundary(first, len(parts[0]))
        if cut <= 0 or cut >= len(first):
            return segments
        return [first[:cut], first[cut:], *segments[1:]]


def _word_boundary(segment: Union[list[Any], str], cut: int) -> int:
    """``cut`` moved back to the start of the word it falls in (0 when the first word has no start before it).

    Pieces (IndexTTS-2): a word starts at a piece with the word mark.  Text (2.5): a cut between
    two letters of a script that spaces its words is inside a word."""
    if isinstance(segment, str):
        while 0 < cut < len(segment) and _spaced_letter(segment[cut - 1]) and _spaced_letter(segment[cut]):
            cut -= 1
        return cut
    while 0 < cut < len(segment) and not _starts_word(segment[cut]):
        cut -= 1
    return cut


def _spaced_letter(char: str) -> bool:
    return char.isalnum() and not re.match(f"[{_CJK}]", char)


def _starts_word(piece: Any) -> bool:
    text = str(piece)
    return text.startswith(_WORD_MARK) or not any(c.isalnum() for c in text)
