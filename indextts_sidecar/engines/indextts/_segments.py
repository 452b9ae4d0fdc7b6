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

that hands the segmenter's result back unchanged and keeps its text.  Upstream's code and
class are untouched: the wrapper is an attribute of the one instance.  Where neither
segmenter exists (another upstream version), nothing is wrapped and segments carry no text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, Union

__all__ = ["SegmentTexts", "pieces_text"]

log = logging.getLogger("indextts_sidecar.engines.indextts")

#: Sentencepiece's word-boundary mark.
_WORD_MARK = "\u2581"
#: Characters written without spaces between them (upstream spaces them out for its tokenizer).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_GAP = re.compile(f"(?<=[{_CJK}]) (?=[{_CJK}])")
_SPACES = re.compile(r"\s+")


def pieces_text(pieces: Any) -> str:
    """The text of a segment's sentencepiece pieces: word marks as spaces, none between CJK characters."""
    joined = "".join(str(piece) for piece in pieces).replace(_WORD_MARK, " ")
    return _CJK_GAP.sub("", _SPACES.sub(" ", joined).strip())


def _plain_text(segment: Any) -> str:
    return _SPACES.sub(" ", str(segment)).strip()


class SegmentTexts:
    """The texts of the segments upstream cut the current request into, in order."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def start(self) -> None:
        """Forget the last request's segments (call before each request)."""
        self.texts = []

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
            if isinstance(segments, (list, tuple)):  # upstream's are lists: never consume an iterator
                try:
                    self.texts.extend([text_of(segment) for segment in segments])
                except Exception as exc:  # the text is a nicety: never let it fail the request
                    log.warning("could not read the segments' text: %s: %s", type(exc).__name__, exc)
            return segments

        recording.__wrapped__ = split  # type: ignore[attr-defined]
        return recording
