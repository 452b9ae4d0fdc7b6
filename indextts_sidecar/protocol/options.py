"""``KEY=VALUE`` options, as the sidecar's ``-o`` and the client's command line take them."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["parse_options"]


def parse_options(pairs: list[str], kind: str = "engine option") -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}``: JSON values where they parse.

    ``kind`` names what the pairs are in the error for a malformed one.
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{kind} {pair!r} is not KEY=VALUE")
        try:
            options[key.replace("-", "_")] = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            options[key.replace("-", "_")] = raw
    return options
