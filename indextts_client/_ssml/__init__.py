"""SSML: one reader for every front end, and the plan it produces (see docs/client.md#ssml)."""

from __future__ import annotations

from ._parse import BREAK_STRENGTHS, RATE_WORDS, SsmlLimits, parse_ssml
from ._plan import Phoneme, Piece, Silence, SsmlError, SsmlPlan, TextRun

__all__ = [
    "BREAK_STRENGTHS",
    "RATE_WORDS",
    "Phoneme",
    "Piece",
    "Silence",
    "SsmlError",
    "SsmlLimits",
    "SsmlPlan",
    "TextRun",
    "parse_ssml",
]
