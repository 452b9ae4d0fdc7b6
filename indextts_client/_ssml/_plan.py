"""What the SSML reader produces: a typed plan of text runs and silences, and its errors."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal, Union

from .._exceptions import InvalidRequestError

__all__ = ["Phoneme", "Piece", "Silence", "SsmlError", "SsmlPlan", "TextRun"]

#: ``invalid_ssml``: not SSML this reader takes (malformed, hostile, a bad value, over a bound);
#: ``unsupported``: well-formed, but a tag or attribute the reader or the engine cannot honour.
SsmlCode = Literal["invalid_ssml", "unsupported"]


class SsmlError(InvalidRequestError):
    """An SSML text refused before anything is sent: ``code`` ``invalid_ssml`` or ``unsupported``.

    ``line`` and ``column`` (1-based; 0 where no place applies, e.g. a document too large)
    say where; ``tag`` and ``attribute`` name what, where one is at fault.  ``detail`` holds
    the same facts (``field`` is ``"text"``), as a sidecar's refusal does.
    """

    def __init__(
        self,
        message: str = "",
        *,
        code: str = "invalid_ssml",
        line: int = 0,
        column: int = 0,
        tag: Union[str, None] = None,
        attribute: Union[str, None] = None,
        detail: Union[dict[str, Any], None] = None,
        retryable: bool = False,
        request_id: Union[int, None] = None,
    ) -> None:
        facts: dict[str, Any] = {"field": "text", "line": line, "column": column}
        if tag is not None:
            facts["tag"] = tag
        if attribute is not None:
            facts["attribute"] = attribute
        facts.update(detail or {})
        where = f" (line {line}, column {column})" if line else ""
        super().__init__(message + where, code=code, detail=facts, retryable=retryable, request_id=request_id)
        self.line = line
        self.column = column
        self.tag = tag
        self.attribute = attribute


@dataclass(frozen=True)
class Piece:
    """Characters ``[text_start, ...)`` of a run come from source characters ``[source_start,
    source_end)``: one to one when ``exact`` (written as is), else all of them from that span
    (an entity such as ``&amp;``, a ``\\r\\n``, a rewrite by ``sub`` or ``say-as``)."""

    text_start: int
    source_start: int
    source_end: int
    exact: bool


@dataclass(frozen=True)
class Phoneme:
    """``<phoneme alphabet=... ph=...>``: the pronunciation the run's text is to be read with."""

    alphabet: Literal["x-arpabet", "pinyin", "x-kana"]
    ph: str


@dataclass(frozen=True)
class TextRun:
    """Text to speak, with what annotates it.

    ``text`` is what is read: the source's characters (entities decoded), or the rewrite of a
    ``<sub alias>`` or ``<say-as>``; with ``phoneme`` it is the word the pronunciation is for.
    ``span`` is the run's place in the SSML source (``source[start:end]``); ``pieces`` map
    each of its characters back there (:meth:`source_span`).  ``lang`` is the ``xml:lang`` in
    force (None: none given), ``rate`` the ``<prosody rate>`` in force (1: the engine's normal
    speed).  ``line`` and ``column`` are where the annotating element starts, for an engine
    that refuses it.
    """

    text: str
    span: tuple[int, int]
    pieces: tuple[Piece, ...]
    lang: Union[str, None] = None
    rate: Fraction = Fraction(1)
    phoneme: Union[Phoneme, None] = None
    #: ``sub`` or ``say-as`` when the text is such a rewrite, else None.
    rewrite: Union[str, None] = None
    line: int = 0
    column: int = 0
    #: The annotating element and attribute an engine would refuse (``phoneme``/``alphabet``,
    #: ``prosody``/``rate``, ``lang``/``xml:lang``).
    rate_at: tuple[int, int] = (0, 0)
    lang_at: tuple[int, int] = (0, 0)
    _starts: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def source_span(self, start: int, end: int) -> tuple[int, int]:
        """Where characters ``[start, end)`` of :attr:`text` are in the SSML source."""
        starts = self._starts or tuple(piece.text_start for piece in self.pieces)
        if not self.pieces:
            return self.span
        first = self.pieces[max(0, bisect.bisect_right(starts, start) - 1)]
        last = self.pieces[max(0, bisect.bisect_right(starts, max(start, end - 1)) - 1)]
        lo = first.source_start + (start - first.text_start) if first.exact else first.source_start
        hi = last.source_start + (end - last.text_start) if last.exact else last.source_end
        return (lo, max(lo, hi))


@dataclass(frozen=True)
class Silence:
    """A ``<break>``: exactly ``seconds`` of silence (a fraction, as written), at ``span``."""

    seconds: Fraction
    span: tuple[int, int]
    line: int = 0
    column: int = 0

    def samples(self, sample_rate: int) -> int:
        """Its length in samples at ``sample_rate``: the nearest whole sample."""
        return round(self.seconds * sample_rate)


@dataclass(frozen=True)
class SsmlPlan:
    """An SSML text read: runs and silences in order, the source they came from, and the sum
    of the silences."""

    source: str
    items: tuple[Union[TextRun, Silence], ...]
    silence: Fraction = Fraction(0)
    #: The ``xml:lang`` of ``<speak>``: the document's language (None: not given).
    lang: Union[str, None] = None

    @property
    def text(self) -> str:
        """The words read, without markup (runs' texts, as read)."""
        return "".join(item.text for item in self.items if isinstance(item, TextRun))
