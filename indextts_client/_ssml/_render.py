"""An SSML plan rendered for one engine: the requests to send and the silences between them.

What an engine honours is said here, by the name its ``ready`` frame gives, and by its speed
control (the same frame's ``speed``): the client refuses an SSML text before anything is sent.

=============  =====================================  ==================  ==========================
engine         <phoneme>                              <prosody rate>      <lang> / xml:lang
=============  =====================================  ==================  ==========================
fake           every alphabet, as ``<word|PH>``       ``seconds_per_char``  any (not used)
espeak         refused                                ``rate``            the voice of that language
indextts2.5    every alphabet, as ``<word|PH>``       ``duration_factor``  ``lang``: zh en ja es ar
indextts2      pinyin: the word becomes ``HANG2``     refused (no speed)  zh, en (not used)
indextts       pinyin, as indextts2                   refused (no speed)  zh, en (not used)
other engines  refused                                its speed control   refused
=============  =====================================  ==================  ==========================

``<break>``, ``<sub>``, ``<say-as>``, ``<p>`` and ``<s>`` need nothing of the engine: breaks are
silences the client inserts, the others rewrite the text.  A break ends a segment, and so does a
change of rate or language: each segment is one ``synthesize`` request.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from indextts_sidecar.protocol.engine_info import SpeedControl

from ._plan import Phoneme, Silence, SsmlError, SsmlPlan, TextRun

__all__ = ["PROFILES", "EngineSsml", "Segment", "render"]

_ALPHABETS = frozenset({"x-arpabet", "pinyin", "x-kana"})
#: What IndexTTS-2.5 takes as a pronunciation mark's word: no ``|``, ``<``, ``>`` or line break.
_MARK_WORD = re.compile(r"[^|<>\n]+\Z")


def _mark(word: str, phoneme: Phoneme) -> Union[str, None]:
    """IndexTTS-2.5's inline pronunciation ``<word|PHONES>`` (upper case, as upstream reads it)."""
    if not _MARK_WORD.match(word):
        return None
    return f"<{word}|{phoneme.ph.upper()}>"


def _pinyin(word: str, phoneme: Phoneme) -> Union[str, None]:
    """IndexTTS-2 reads upper-case pinyin with its tone digit in place of the word: ``HANG2``."""
    return " ".join(syllable.upper() for syllable in phoneme.ph.split())


@dataclass(frozen=True)
class EngineSsml:
    """What one engine honours of SSML, beyond what the client does itself."""

    #: Phoneme alphabets, and how a word with its phonemes is written for the engine.
    alphabets: frozenset[str] = frozenset()
    phoneme: Callable[[str, Phoneme], Union[str, None]] = _mark
    #: Languages (base codes) it speaks; None: any.
    languages: Union[frozenset[str], None] = frozenset()
    #: The request option a language is given in (IndexTTS-2.5's ``lang``), if any.
    lang_option: Union[str, None] = None
    #: Whether a language is spoken with the engine's voice of that name (espeak).
    lang_voice: bool = False


PROFILES: Mapping[str, EngineSsml] = {
    "fake": EngineSsml(alphabets=_ALPHABETS, languages=None),
    "espeak": EngineSsml(languages=None, lang_voice=True),
    "indextts2.5": EngineSsml(
        alphabets=_ALPHABETS, languages=frozenset({"zh", "en", "ja", "es", "ar"}), lang_option="lang"
    ),
    "indextts2": EngineSsml(alphabets=frozenset({"pinyin"}), phoneme=_pinyin, languages=frozenset({"zh", "en"})),
    "indextts": EngineSsml(alphabets=frozenset({"pinyin"}), phoneme=_pinyin, languages=frozenset({"zh", "en"})),
}
_OTHER = EngineSsml()


@dataclass(frozen=True)
class Segment:
    """One request: ``text`` as the engine reads it, with its ``options`` and ``voice``.

    ``parts`` map the text back to the SSML source: ``(start, end, run, exact)``, characters
    ``[start, end)`` of ``text`` from ``run`` (its own characters when ``exact``, else a rewrite
    that stands for the whole run's span).
    """

    text: str
    options: Mapping[str, Any]
    voice: Union[str, None]
    parts: tuple[tuple[int, int, TextRun, bool], ...]

    def source_span(self, start: int, end: int) -> tuple[int, int]:
        """Where characters ``[start, end)`` of :attr:`text` come from in the SSML source."""
        lo: Union[int, None] = None
        hi = 0
        for part_start, part_end, run, exact in self.parts:
            if part_end <= start or part_start >= end:
                continue
            a, b = max(start, part_start), min(end, part_end)
            span = run.source_span(a - part_start, b - part_start) if exact else run.span
            lo = span[0] if lo is None else min(lo, span[0])
            hi = max(hi, span[1])
        if lo is None:  # a separator: nothing of the source
            return (0, 0)
        return (lo, hi)


def _place(plan: SsmlPlan, run: TextRun) -> tuple[int, int]:
    """Line and column (1-based) of a run's first character in the source."""
    start = run.span[0]
    return plan.source.count("\n", 0, start) + 1, start - plan.source.rfind("\n", 0, start)


def _refuse(message: str, run: TextRun, at: tuple[int, int], tag: str, attribute: str) -> SsmlError:
    line, column = at if at != (0, 0) else (run.line, run.column)
    return SsmlError(message, code="unsupported", line=line, column=column, tag=tag, attribute=attribute)


def render(
    plan: SsmlPlan,
    engine: str,
    speed: Union[SpeedControl, None],
    *,
    strict: bool = True,
    voice: Union[str, None] = None,
    options: Union[Mapping[str, Any], None] = None,
) -> list[Union[Segment, Silence]]:
    """``plan`` as the requests and silences for ``engine`` (its ``ready`` name and speed control).

    ``voice`` and ``options`` are the caller's; a segment's rate or language sets its own.
    Raises :class:`SsmlError` (``unsupported``) for what the engine cannot honour, unless not
    ``strict``: then a phoneme reads as its word, and a rate or language is not applied.
    """
    profile = PROFILES.get(engine, _OTHER)
    caller = dict(options or {})
    steps: list[Union[Segment, Silence]] = []
    texts: list[str] = []
    parts: list[tuple[int, int, TextRun, bool]] = []
    key: Union[tuple[Any, ...], None] = None
    size = 0

    def close() -> None:
        nonlocal texts, parts, key, size
        text = "".join(texts)
        if key is not None and text.strip():
            extra, segment_voice = key
            steps.append(Segment(text, {**caller, **dict(extra)}, segment_voice, tuple(parts)))
        texts, parts, key, size = [], [], None, 0

    for item in plan.items:
        if isinstance(item, Silence):
            close()
            steps.append(item)
            continue
        extra, segment_voice = _settings(item, plan, profile, engine, speed, strict, voice, caller)
        text, exact = _text(item, plan, profile, engine, strict)
        run_key = (tuple(sorted(extra.items())), segment_voice)
        if key is not None and run_key != key:
            close()
        key = run_key
        texts.append(text)
        parts.append((size, size + len(text), item, exact))
        size += len(text)
    close()
    return steps


def _settings(
    item: TextRun,
    plan: SsmlPlan,
    profile: EngineSsml,
    engine: str,
    speed: Union[SpeedControl, None],
    strict: bool,
    voice: Union[str, None],
    caller: Mapping[str, Any],
) -> tuple[dict[str, Any], Union[str, None]]:
    """A run's own options (its rate, its language) and voice, beside the caller's."""
    extra: dict[str, Any] = {}
    segment_voice = voice
    if item.rate != 1:
        value = speed.value(float(item.rate)) if speed is not None else None
        if value is not None:
            extra[speed.option] = value  # type: ignore[union-attr]
        elif strict:
            why = "has no speed control" if speed is None else f"takes speeds {speed.speed_range()}"
            raise _refuse(f"prosody rate {float(item.rate):g}: {engine} {why}", item, item.rate_at, "prosody", "rate")
    if item.lang is not None:
        base = item.lang.lower().split("-")[0]
        known = profile.languages is None or base in profile.languages
        if not known:
            if strict:
                raise _refuse(
                    f"language {item.lang!r}: {engine} does not speak it", item, item.lang_at, "lang", "xml:lang"
                )
        elif profile.lang_option is not None and (item.lang != plan.lang or profile.lang_option not in caller):
            extra[profile.lang_option] = base
        elif profile.lang_voice and (item.lang != plan.lang or voice is None):
            segment_voice = item.lang.lower()
    return extra, segment_voice


def _text(item: TextRun, plan: SsmlPlan, profile: EngineSsml, engine: str, strict: bool) -> tuple[str, bool]:
    """A run's text as the engine reads it, and whether it is the run's own characters (not a rewrite)."""
    text = item.text
    exact = item.rewrite is None
    if profile.alphabets and profile.phoneme is _mark and item.phoneme is None and ("<" in text or ">" in text):
        # This engine reads <word|PH> in its text as a pronunciation: text (an &lt; written
        # in the SSML, a <sub> alias) must not make one.
        if strict:
            line, column = (item.line, item.column) if item.line else _place(plan, item)
            raise SsmlError(
                f"{engine} would read the < or > in {text[:40]!r} as a pronunciation mark: use <phoneme>",
                code="unsupported",
                line=line,
                column=column,
            )
        text = text.replace("<", "\u2039").replace(">", "\u203a")
    if item.phoneme is not None:
        written = profile.phoneme(text, item.phoneme) if item.phoneme.alphabet in profile.alphabets else None
        if written is None and strict:
            raise _refuse(
                f"phoneme alphabet {item.phoneme.alphabet}: {engine} cannot read it here",
                item,
                (item.line, item.column),
                "phoneme",
                "alphabet",
            )
        if written is not None:
            text, exact = written, False
    return text, exact
