"""``tn.english.normalizer.Normalizer`` as wetext's English text normalizer (see ``tn``)."""

from __future__ import annotations

from typing import Any


class Normalizer:
    def __init__(self, **_ignored: Any) -> None:
        # overwrite_cache: a pynini build option, nothing to build here.
        from wetext import Normalizer as WeText  # type: ignore[import-not-found]

        self._normalizer = WeText(lang="en", operator="tn")

    def normalize(self, text: str) -> str:
        return str(self._normalizer.normalize(text))
