"""``tn.chinese.normalizer.Normalizer`` as wetext's Chinese text normalizer (see ``tn``)."""

from __future__ import annotations

from typing import Any


class Normalizer:
    def __init__(self, *, remove_erhua: bool = False, **_ignored: Any) -> None:
        # cache_dir, remove_interjections, overwrite_cache: pynini build options, nothing to build here.
        from wetext import Normalizer as WeText  # type: ignore[import-not-found]

        self._normalizer = WeText(remove_erhua=remove_erhua, lang="zh", operator="tn")

    def normalize(self, text: str) -> str:
        return str(self._normalizer.normalize(text))
