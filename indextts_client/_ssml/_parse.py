"""The SSML reader: a source text in, an :class:`SsmlPlan` out, or a typed :class:`SsmlError`.

The XML is read by ``defusedxml``'s expat reader with DTDs, entity declarations and external
references forbidden; processing instructions are refused here.  Every count is bounded before
the work it causes: the source's size, the elements (all of them, and nested), each break and
the silence of the whole text.  Positions are the source's characters: expat's line and column
(in code points) give each event's character offset.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Union
from xml.sax import SAXParseException
from xml.sax.handler import ContentHandler
from xml.sax.xmlreader import AttributesImpl

from ._numbers import MAX_DIGITS, cardinal, digits, ordinal
from ._plan import Phoneme, Piece, Silence, SsmlError, SsmlPlan, TextRun

__all__ = ["BREAK_STRENGTHS", "RATE_WORDS", "SsmlLimits", "parse_ssml"]

#: ``<break strength=...>`` in seconds (no ``time``); a bare ``<break/>`` is ``medium``.
BREAK_STRENGTHS = {
    "none": Fraction(0),
    "x-weak": Fraction(1, 10),
    "weak": Fraction(1, 4),
    "medium": Fraction(1, 2),
    "strong": Fraction(3, 4),
    "x-strong": Fraction(1),
}
#: ``<prosody rate=...>`` keywords, as speeds (1: normal).
RATE_WORDS = {
    "x-slow": Fraction(1, 2),
    "slow": Fraction(3, 4),
    "medium": Fraction(1),
    "default": Fraction(1),
    "fast": Fraction(3, 2),
    "x-fast": Fraction(2),
}
_RATE_RANGE = (Fraction(1, 4), Fraction(4))
_TIME = re.compile(r"\s*(\d{1,9}(?:\.\d{1,6})?|\.\d{1,6})\s*(ms|s)\s*\Z")
_RATE = re.compile(r"\s*([+-]?)(\d{1,6}(?:\.\d{1,6})?|\.\d{1,6})\s*(%?)\s*\Z")
_INTEGER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+\Z|[+-]?\d+\Z")
_PINYIN = re.compile(r"[A-Za-zÜü:]{1,7}[1-5]?(?:[ \t]+[A-Za-zÜü:]{1,7}[1-5]?)*\Z")
_ARPABET = re.compile(r"[A-Za-z]{1,3}[0-2]?(?:[ \t]+(?:\.|[A-Za-z]{1,3}[0-2]?))*\Z")
_KANA = re.compile(r"[\u3040-\u30ff\s]+\Z")
_PH_CHECK = {"pinyin": _PINYIN, "x-arpabet": _ARPABET, "x-kana": _KANA}
_SAY_AS = ("characters", "spell-out", "digits", "cardinal", "ordinal")
_SPEAK_ATTRIBUTES = frozenset({"version", "xml:lang", "xmlns", "xmlns:xsi", "xsi:schemaLocation"})
#: Elements whose content is one piece of text that they rewrite or annotate.
_LEAVES = frozenset({"phoneme", "sub", "say-as"})
_LINE_BREAK = re.compile(r"\r\n?|\n")


@dataclass(frozen=True)
class SsmlLimits:
    """The bounds a text is read under; each refusal is ``invalid_ssml``."""

    #: The source's size, in UTF-8 bytes.
    max_bytes: int = 1 << 20
    #: Elements in all.
    max_elements: int = 10_000
    #: Elements inside one another.
    max_depth: int = 32
    #: Seconds of silence in all the breaks of the text (one break included).
    max_silence: float = 60.0


@dataclass
class _Context:
    lang: Union[str, None] = None
    rate: Fraction = Fraction(1)
    rate_at: tuple[int, int] = (0, 0)
    lang_at: tuple[int, int] = (0, 0)


@dataclass
class _Leaf:
    """A phoneme, sub or say-as element being read: its attributes and the text inside."""

    tag: str
    attributes: dict[str, str]
    line: int
    column: int
    start: int
    text: list[str] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)
    size: int = 0


class _Reader(ContentHandler):
    def __init__(self, source: str, strict: bool, limits: SsmlLimits, where: Callable[[], tuple[int, int, int]]):
        super().__init__()
        self.source = source
        self.strict = strict
        self.limits = limits
        self.where = where  # (line, column, source offset) of the event being handled
        self.items: list[Union[TextRun, Silence]] = []
        self.stack: list[tuple[str, _Context]] = []
        self.elements = 0
        self.silence = Fraction(0)
        self.max_silence = Fraction(limits.max_silence).limit_denominator(1000)
        self.leaf: Union[_Leaf, None] = None
        self.depth_leaf = 0
        # the run being gathered: its text, pieces and context
        self.run_text: list[str] = []
        self.run_pieces: list[Piece] = []
        self.run_size = 0
        self.run_context: Union[_Context, None] = None
        self.pending_space = False
        self.lang: Union[str, None] = None

    # -- errors
    def fail(
        self,
        message: str,
        *,
        code: str = "invalid_ssml",
        tag: Union[str, None] = None,
        attribute: Union[str, None] = None,
    ) -> SsmlError:
        line, column, _ = self.where()
        return SsmlError(message, code=code, line=line, column=column, tag=tag, attribute=attribute)

    def unsupported(self, message: str, *, tag: str, attribute: Union[str, None] = None) -> None:
        if self.strict:
            raise self.fail(message, code="unsupported", tag=tag, attribute=attribute)

    # -- runs
    def context(self) -> _Context:
        return self.stack[-1][1] if self.stack else _Context()

    def flush(self) -> None:
        if self.run_text and self.run_context is not None:
            text = "".join(self.run_text)
            pieces = tuple(self.run_pieces)
            span = (pieces[0].source_start, pieces[-1].source_end)
            context = self.run_context
            self.items.append(
                TextRun(
                    text, span, pieces, context.lang, context.rate, rate_at=context.rate_at, lang_at=context.lang_at
                )
            )
        self.run_text, self.run_pieces, self.run_size, self.run_context = [], [], 0, None

    def separate(self) -> None:
        """A sentence or paragraph edge: the next text read is kept apart by a space."""
        self.pending_space = True

    def space(self, following: str) -> None:
        """The space a sentence or paragraph edge asked for, unless there is one already."""
        if (
            self.pending_space
            and self.run_text
            and not self.run_text[-1][-1:].isspace()
            and not following[:1].isspace()
        ):
            _, _, offset = self.where()
            self.run_pieces.append(Piece(self.run_size, offset, offset, False))
            self.run_text.append(" ")
            self.run_size += 1
        self.pending_space = False

    # -- SAX events
    def processingInstruction(self, target: str, data: str) -> None:
        raise self.fail(f"processing instruction <?{target}?> not allowed", tag=f"?{target}")

    def skippedEntity(self, name: str) -> None:
        raise self.fail(f"entity &{name}; not allowed", tag=f"&{name};")

    def startElement(self, name: str, attrs: AttributesImpl) -> None:
        self.elements += 1
        if self.elements > self.limits.max_elements:
            raise self.fail(f"more than {self.limits.max_elements} elements", tag=name)
        if len(self.stack) >= self.limits.max_depth:
            raise self.fail(f"elements nested more than {self.limits.max_depth} deep", tag=name)
        attributes = dict(attrs)
        parent = self.context()
        context = _Context(parent.lang, parent.rate, parent.rate_at, parent.lang_at)
        line, column, _ = self.where()
        if not self.stack and name != "speak":
            raise self.fail(f"the root element must be <speak>, not <{name}>", tag=name)
        if self.leaf is not None:
            if self.strict:
                raise self.fail(f"<{name}> inside <{self.leaf.tag}>: it takes text only", tag=name)
            self.depth_leaf += 1
            self.stack.append((name, context))
            return
        if "xml:lang" in attributes and name in ("speak", "p", "s", "lang"):
            lang = attributes["xml:lang"].strip()
            if not re.fullmatch(r"[A-Za-z]{1,8}(?:-[A-Za-z0-9]{1,8}){0,4}", lang):
                raise self.fail(f"xml:lang {lang!r} is not a language tag", tag=name, attribute="xml:lang")
            context.lang, context.lang_at = lang, (line, column)
        allowed: frozenset[str]
        if name == "speak":
            if self.stack:
                raise self.fail("<speak> inside <speak>", tag=name)
            self.lang = context.lang
            allowed = _SPEAK_ATTRIBUTES
        elif name in ("p", "s"):
            allowed = frozenset({"xml:lang"})
            self.separate()
        elif name == "lang":
            if "xml:lang" not in attributes:
                raise self.fail("<lang> needs xml:lang", tag=name, attribute="xml:lang")
            allowed = frozenset({"xml:lang"})
        elif name == "break":
            allowed = frozenset({"time", "strength"})
            self._break(attributes)
        elif name == "prosody":
            allowed = frozenset({"rate"})
            if "rate" in attributes:
                context.rate = self._rate(attributes["rate"], parent.rate)
                context.rate_at = (line, column)
        elif name in _LEAVES:
            allowed = self._leaf_attributes(name, attributes)
            self.space("x")
            self.flush()
            _, _, offset = self.where()
            self.leaf = _Leaf(name, attributes, line, column, offset)
        else:
            self.unsupported(f"<{name}> is not supported", tag=name)
            allowed = frozenset(attributes)
        for attribute in attributes:
            if attribute not in allowed:
                self.unsupported(f"<{name} {attribute}=...> is not supported", tag=name, attribute=attribute)
        if (
            name != "break"
            and self.run_context is not None
            and (context.lang != self.run_context.lang or context.rate != self.run_context.rate)
        ):
            self.flush()
        self.stack.append((name, context))

    def endElement(self, name: str) -> None:
        self.stack.pop()
        if self.leaf is not None:
            if self.depth_leaf:
                self.depth_leaf -= 1
                return
            leaf, self.leaf = self.leaf, None
            self._end_leaf(leaf)
            return
        if name in ("p", "s"):
            self.separate()
        after = self.context()
        if self.run_context is not None and (
            after.lang != self.run_context.lang or after.rate != self.run_context.rate
        ):
            self.flush()

    def characters(self, content: str) -> None:
        if not self.stack:
            return
        _, _, offset = self.where()
        source = self.source
        if source.startswith("&", offset):  # a literal & is always written as an entity
            piece_end, exact = source.find(";", offset) + 1, False
        elif source.startswith(content, offset):
            piece_end, exact = offset + len(content), True
        elif source.startswith("<![CDATA[", offset) and source.startswith(content, offset + 9):
            offset, piece_end, exact = offset + 9, offset + 9 + len(content), True
        else:
            piece_end, exact = offset + (2 if source.startswith("\r\n", offset) else 1), False
        if self.leaf is not None:
            leaf = self.leaf
            leaf.pieces.append(Piece(leaf.size, offset, piece_end, exact))
            leaf.text.append(content)
            leaf.size += len(content)
            return
        context = self.context()
        self.space(content)
        if self.run_context is None:
            self.run_context = context
        self.run_pieces.append(Piece(self.run_size, offset, piece_end, exact))
        self.run_text.append(content)
        self.run_size += len(content)

    # -- elements
    def _break(self, attributes: dict[str, str]) -> None:
        if "time" in attributes:
            match = _TIME.match(attributes["time"])
            if match is None:
                raise self.fail(
                    f"break time {attributes['time'][:40]!r} is not a length such as 250ms or 1.5s",
                    tag="break",
                    attribute="time",
                )
            seconds = Fraction(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
        elif "strength" in attributes:
            strength = attributes["strength"]
            if strength not in BREAK_STRENGTHS:
                raise self.fail(
                    f"break strength {strength[:40]!r} is not one of {', '.join(BREAK_STRENGTHS)}",
                    tag="break",
                    attribute="strength",
                )
            seconds = BREAK_STRENGTHS[strength]
        else:
            seconds = BREAK_STRENGTHS["medium"]
        if self.silence + seconds > self.max_silence:
            raise self.fail(
                f"breaks add up to more than {self.limits.max_silence:g} s of silence",
                tag="break",
                attribute="time" if "time" in attributes else None,
            )
        self.silence += seconds
        self.flush()
        line, column, offset = self.where()
        end = self.source.find(">", offset) + 1
        self.items.append(Silence(seconds, (offset, end), line, column))

    def _rate(self, value: str, enclosing: Fraction) -> Fraction:
        if value in RATE_WORDS:
            return RATE_WORDS[value]
        match = _RATE.match(value)
        if match is None:
            raise self.fail(f"prosody rate {value[:40]!r} is not a rate", tag="prosody", attribute="rate")
        sign, number, percent = match.groups()
        amount = Fraction(number) / (100 if percent else 1)
        if sign:  # relative: +10% is 1.1 times the enclosing rate
            if not percent:
                raise self.fail(
                    f"prosody rate {value!r}: a relative rate is a percentage", tag="prosody", attribute="rate"
                )
            rate = enclosing * (1 + amount if sign == "+" else 1 - amount)
        else:
            rate = enclosing * amount
        if not _RATE_RANGE[0] <= rate <= _RATE_RANGE[1]:
            raise self.fail(f"prosody rate {value!r} is outside 25%..400%", tag="prosody", attribute="rate")
        return rate

    def _leaf_attributes(self, name: str, attributes: dict[str, str]) -> frozenset[str]:
        if name == "phoneme":
            alphabet = attributes.get("alphabet")
            if "ph" not in attributes:
                raise self.fail("<phoneme> needs ph", tag=name, attribute="ph")
            if alphabet not in _PH_CHECK:
                self.unsupported(
                    f"phoneme alphabet {str(alphabet)[:40]!r} is not supported (x-arpabet, pinyin, x-kana)",
                    tag=name,
                    attribute="alphabet",
                )
            elif not _PH_CHECK[alphabet].match(attributes["ph"].strip()):
                raise self.fail(f"ph {attributes['ph'][:40]!r} is not {alphabet}", tag=name, attribute="ph")
            return frozenset({"alphabet", "ph"})
        if name == "sub":
            if "alias" not in attributes:
                raise self.fail("<sub> needs alias", tag=name, attribute="alias")
            return frozenset({"alias"})
        kind = attributes.get("interpret-as")
        if kind is None:
            raise self.fail("<say-as> needs interpret-as", tag=name, attribute="interpret-as")
        if kind not in _SAY_AS:
            self.unsupported(
                f"say-as interpret-as={kind[:40]!r} is not supported ({', '.join(_SAY_AS)})",
                tag=name,
                attribute="interpret-as",
            )
        return frozenset({"interpret-as"})

    def _end_leaf(self, leaf: _Leaf) -> None:
        self.flush()
        _, _, offset = self.where()
        end = self.source.find(">", offset) + 1
        span = (leaf.start, end)
        text = "".join(leaf.text)
        context = self.context()
        attributes = leaf.attributes
        common: dict[str, Any] = dict(
            lang=context.lang,
            rate=context.rate,
            line=leaf.line,
            column=leaf.column,
            rate_at=context.rate_at,
            lang_at=context.lang_at,
        )
        whole = (Piece(0, span[0], span[1], False),)
        if leaf.tag == "phoneme" and attributes.get("alphabet") in _PH_CHECK:
            if not text.strip():
                raise SsmlError("<phoneme> has no text to pronounce", line=leaf.line, column=leaf.column, tag="phoneme")
            ph = Phoneme(attributes["alphabet"], " ".join(attributes["ph"].split()))  # type: ignore[arg-type]
            self.items.append(TextRun(text, span, tuple(leaf.pieces) or whole, phoneme=ph, **common))
        elif leaf.tag == "sub":
            self.items.append(TextRun(attributes["alias"], span, whole, rewrite="sub", **common))
        elif leaf.tag == "say-as" and attributes.get("interpret-as") in _SAY_AS:
            spoken = self._say_as(attributes["interpret-as"], text, context.lang or "en", leaf)
            self.items.append(TextRun(spoken, span, whole, rewrite="say-as", **common))
        elif text:  # not strict: an element it cannot honour reads as its text
            self.items.append(TextRun(text, span, tuple(leaf.pieces), **common))

    def _say_as(self, kind: str, text: str, lang: str, leaf: _Leaf) -> str:
        base = lang.lower().split("-")[0]
        if base not in ("en", "zh", "cmn", "yue"):
            if self.strict:
                raise SsmlError(
                    f"say-as for language {lang!r} is not supported (English and Chinese)",
                    code="unsupported",
                    line=leaf.line,
                    column=leaf.column,
                    tag="say-as",
                    attribute="xml:lang",
                )
            return text
        if kind in ("characters", "spell-out"):
            return " ".join(char for char in text if not char.isspace())
        if kind == "digits":
            return digits(text, lang)
        number = text.strip()
        if not _INTEGER.match(number) or len(number.replace(",", "").lstrip("+-")) > MAX_DIGITS:
            raise SsmlError(
                f"say-as {kind}: {number[:40]!r} is not a whole number of at most {MAX_DIGITS} digits",
                line=leaf.line,
                column=leaf.column,
                tag="say-as",
                attribute="interpret-as",
            )
        value = int(number.replace(",", ""))
        if kind == "ordinal":
            if value < 1:
                raise SsmlError(
                    f"say-as ordinal: {number!r} is not 1 or more",
                    line=leaf.line,
                    column=leaf.column,
                    tag="say-as",
                    attribute="interpret-as",
                )
            return ordinal(value, lang)
        return cardinal(value, lang)


def _markup_over(source: str, limit: int) -> Union[int, None]:
    """Where the ``limit + 1``-th ``<`` of ``source`` is (start and end tags, comments...), if any."""
    if source.count("<") <= limit:
        return None
    at = -1
    for _ in range(limit + 1):
        at = source.find("<", at + 1)
    return at


def _line_starts(source: str) -> list[int]:
    """Where each line of ``source`` starts, lines broken as expat breaks them (CR LF, CR, LF)."""
    return [0, *(match.end() for match in _LINE_BREAK.finditer(source))]


def parse_ssml(source: str, *, strict: bool = True, limits: SsmlLimits = SsmlLimits()) -> SsmlPlan:
    """Read ``source`` (an SSML document whose root is ``<speak>``) into an :class:`SsmlPlan`.

    Raises :class:`SsmlError`: ``invalid_ssml`` for what is not well-formed SSML or breaks a
    bound of ``limits``, ``unsupported`` for a tag or attribute the reader does not honour
    (with ``strict=False`` those read as their text instead).
    """
    if not isinstance(source, str):
        raise TypeError(f"SSML must be a str, not {type(source).__name__}")
    try:
        data = source.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SsmlError(f"the text is not valid Unicode at character {exc.start}") from None
    if len(data) > limits.max_bytes:
        raise SsmlError(f"SSML of {len(data)} bytes is over the limit of {limits.max_bytes}")
    try:
        from defusedxml import DefusedXmlException
        from defusedxml.expatreader import DefusedExpatParser
    except ImportError:
        raise RuntimeError("reading SSML needs defusedxml: pip install 'indextts-sidecar[ssml]'") from None
    parser = DefusedExpatParser(forbid_dtd=True, forbid_entities=True, forbid_external=True)
    lines = _line_starts(source)
    too_many = _markup_over(source, 2 * limits.max_elements + 16)
    if too_many is not None:  # a cheap count first: no expat callbacks for 100,000 tags
        line = bisect.bisect_right(lines, too_many)
        raise SsmlError(
            f"more than {limits.max_elements} elements (over {2 * limits.max_elements + 16} tags)",
            line=line,
            column=too_many - lines[line - 1] + 1,
        )

    def where() -> tuple[int, int, int]:
        # expat counts lines from 1 and columns from 0 in code points: the offset follows
        line, column = parser.getLineNumber(), parser.getColumnNumber()
        if not isinstance(line, int) or not isinstance(column, int) or not 0 < line <= len(lines):
            return (0, 0, 0)
        return (line, column + 1, lines[line - 1] + column)

    reader = _Reader(source, strict, limits, where)
    parser.setContentHandler(reader)
    parser.setFeature("http://xml.org/sax/features/namespaces", False)
    try:
        parser.feed(data)
        parser.close()
    except SsmlError:
        raise
    except DefusedXmlException as exc:
        line, column, _ = where()
        what = {"DTDForbidden": ("a DTD", "!DOCTYPE"), "EntitiesForbidden": ("an entity declaration", "!ENTITY")}
        said, tag = what.get(type(exc).__name__, ("an external reference", "SYSTEM"))
        raise SsmlError(f"{said} is not allowed", line=line, column=column, tag=tag) from None
    except SAXParseException as exc:
        line, column = exc.getLineNumber() or 0, exc.getColumnNumber() or 0
        raise SsmlError(f"not well-formed XML: {exc.getMessage()}", line=line, column=column + 1) from None
    reader.flush()
    return SsmlPlan(source, tuple(reader.items), reader.silence, reader.lang)
