"""The sentence splitter under stream_text: linear in the text, forced cuts that keep the spaces."""

from __future__ import annotations

import random
from typing import Any

import pytest
import sentence_stream.sentence_stream as library

from indextts_client._sentences import SentenceSplitter


class _Counting:
    """A compiled pattern that counts the characters each search is given, failing past a budget.

    The detector's three searches each scan the text they are given up to a boundary, so the
    characters handed to them bound its work (whatever the machine's speed).
    """

    def __init__(self, pattern: Any, budget: list[int]) -> None:
        self._pattern, self._budget = pattern, budget

    def search(self, text: str, *args: Any) -> Any:
        self._budget[0] -= len(text)
        if self._budget[0] < 0:
            raise AssertionError("the detector scanned more than the linear budget")
        return self._pattern.search(text, *args)


@pytest.fixture
def scan_budget(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    budget = [0]
    for name in ("BLANK_LINES_RE", "SENTENCE_BOUNDARY_ZH_RE", "SENTENCE_BOUNDARY_RE"):
        monkeypatch.setattr(library, name, _Counting(getattr(library, name), budget))
    return budget


HOSTILE = {
    # Each "A." may be an abbreviation, so the detector holds them all waiting for a real end.
    "abbreviations": "A. " * 27_000,
    "dots": "." * 80_000,
    "chinese enders": "。" * 80_000,
    "no boundary": "a" * 80_000,
    "blank lines": "x\n\n" * 27_000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_80_kb_of_hostile_text_costs_scans_linear_in_it(name: str, scan_budget: list[int]) -> None:
    text = HOSTILE[name]
    # Linear: under 1,000 scanned characters per character of text.  Each is scanned by three
    # searches over at most max_chars + PIECE held characters, once per PIECE handed in or per
    # boundary found.  (Handed the whole text at once, the detector alone scans billions.)
    scan_budget[0] = 1000 * len(text)
    splitter = SentenceSplitter(1000)
    sentences = splitter.add(text)
    sentences.append(splitter.finish())
    assert all(len(s) <= 1000 for s in sentences)
    assert "".join(sentences).replace(" ", "").replace("\n", "") == text.replace(" ", "").replace("\n", "")


def test_forced_cuts_keep_the_spaces_between_words() -> None:
    words = [f"w{i}" for i in range(50_000)]
    rng = random.Random(7)
    for fragments in (
        [f"{w} " for w in words],  # an LLM's tokens with their trailing spaces
        [f" {w}" for w in words],  # ... or leading ones
        [" ".join(words)],  # one fragment
    ):
        text = "".join(fragments)
        pieces, at = [], 0
        while at < len(text) and len(fragments) == 1:
            size = rng.randint(1, 700)
            pieces.append(text[at : at + size])
            at += size
        splitter = SentenceSplitter(1000)
        sentences = [s for piece in (pieces or fragments) for s in splitter.add(piece)]
        sentences.append(splitter.finish())
        assert all(len(s) <= 1000 for s in sentences)
        assert len(sentences) > 300
        assert " ".join(sentences).split() == words


def test_a_cut_inside_abbreviations_keeps_the_rest_for_the_next_sentence() -> None:
    splitter = SentenceSplitter(20)
    sentences = splitter.add("Mr. A. B. C. D. E. F. G. Smith came home. He sat.")
    sentences.append(splitter.finish())
    assert all(len(s) <= 20 for s in sentences), sentences
    assert " ".join(sentences).split() == [
        "Mr.",
        "A.",
        "B.",
        "C.",
        "D.",
        "E.",
        "F.",
        "G.",
        "Smith",
        "came",
        "home.",
        "He",
        "sat.",
    ]
    assert sentences[-1] == "He sat."


def test_sentences_are_the_detectors_own_when_nothing_is_cut() -> None:
    text = "Hello there. How are you today? I am fine, thanks! And you?"
    splitter = SentenceSplitter(1000)
    got = [s for i in range(0, len(text), 3) for s in splitter.add(text[i : i + 3])]
    got.append(splitter.finish())
    assert got == list(library.stream_to_sentences([text]))


def test_max_chars_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        SentenceSplitter(0)
