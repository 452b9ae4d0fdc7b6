"""Cheap checks of a request, made before it is queued: text upstream can speak, reference
clips that exist and can be read (the sidecar's path policy has already run on them)."""

from __future__ import annotations

import os
from typing import Any

from .. import RequestError

__all__ = ["check_readable", "check_text", "decoding_asked"]


def check_text(text: str) -> None:
    """Refuse text upstream cannot speak: it raises on empty text, and 2.5 turns text without
    a letter or digit ("...") into audio from the language tag alone."""
    if not text.strip():
        raise RequestError("text is empty", field="$.text")
    if not any(character.isalnum() for character in text):
        raise RequestError(
            "text has no letter or digit to speak (punctuation and spaces alone)",
            field="$.text",
        )


def check_readable(path: str, field: str, what: str) -> None:
    if not path:
        raise RequestError(f"{what} path is empty", field=field)
    if not os.path.exists(path):
        raise RequestError(f"{what} {path!r} does not exist", field=field)
    if not os.path.isfile(path):
        raise RequestError(f"{what} {path!r} is not a file", field=field)
    if not os.access(path, os.R_OK):
        raise RequestError(f"{what} {path!r} is not readable", field=field)


def decoding_asked(options: Any) -> bool:
    """Whether request ``options`` ask for decoding other than upstream's (greedy, or a seed)."""
    return getattr(options, "do_sample", None) is False or getattr(options, "seed", None) is not None
