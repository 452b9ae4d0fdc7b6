"""The word-timing invariant every engine that declares ``word_timings`` keeps (docs/serving.md).

Each whitespace-separated word of the text lies, whole, in exactly one entry, in order: an
entry may hold several words (espeak runs "I am" together), never part of one ("Don" of
"Don't").  A word's "whole" is its characters less the punctuation at its edges ("fine," is
"fine"); a word of punctuation alone ("—") need not be in any entry, as espeak may not speak
it.  Entries do not overlap, their times start in order and lie within the audio.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Sequence


def _word_like(char: str) -> bool:
    return char.isalnum() or unicodedata.category(char).startswith("M")


def word_cores(text: str) -> list[tuple[int, int]]:
    """Each whitespace-separated word of ``text`` with a letter or digit, less its edge punctuation."""
    cores = []
    for match in re.finditer(r"\S+", text):
        first, last = match.start(), match.end()
        while first < last and not _word_like(text[first]):
            first += 1
        while last > first and not _word_like(text[last - 1]):
            last -= 1
        if first < last:
            cores.append((first, last))
    return cores


def check_every_word_once(
    text: str, entries: Sequence[tuple[int, int, float, float]], duration: float, slack: float = 1e-6
) -> None:
    """``entries`` are ``(char_start, char_end, start, end)`` into ``text``, times in the unit of ``duration``."""
    for before, after in itertools.pairwise(entries):
        assert before[1] <= after[0], f"entries overlap or go back: {before} {after} in {text!r}"
        assert before[2] < after[2], f"entries' starts do not increase: {before} {after} in {text!r}"
    for char_start, char_end, start, end in entries:
        assert 0 <= char_start < char_end <= len(text), (char_start, char_end, text)
        assert 0 <= start <= end <= duration + slack, f"times outside the audio of {duration}: {start}, {end}"
    for first, last in word_cores(text):
        holders = [e for e in entries if e[0] <= first and last <= e[1]]
        assert len(holders) == 1, f"word {text[first:last]!r} of {text!r} in {len(holders)} entries: {entries}"
        touching = [e for e in entries if e[0] < last and first < e[1]]
        assert touching == holders, f"word {text[first:last]!r} of {text!r} cut: {touching}"
