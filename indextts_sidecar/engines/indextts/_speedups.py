"""The same-output speed-ups at load (docs/indextts.md, "The same output, faster"): the GPT's
(:mod:`._gpt_fast`) and s2mel's (:mod:`._s2mel_fast`), each on unless its engine option is off.

``load``'s info carries what :func:`install` returns: for each family, each part's name and
``on``, ``off`` or why it is not on.
"""

from __future__ import annotations

from typing import Any

from ._gpt_fast import PARTS as GPT_PARTS
from ._gpt_fast import install as install_gpt
from ._s2mel_fast import PARTS as S2MEL_PARTS
from ._s2mel_fast import install as install_s2mel

__all__ = ["install"]


def install(model: Any, options: Any) -> dict[str, dict[str, str]]:
    """Put on ``model`` the speed-ups that ``options`` (``gpt_speedups``, ``s2mel_speedups``) asks for."""
    gpt = install_gpt(model) if options.gpt_speedups else dict.fromkeys(GPT_PARTS, "off")
    s2mel = install_s2mel(model) if options.s2mel_speedups else dict.fromkeys(S2MEL_PARTS, "off")
    return {"gpt_speedups": gpt, "s2mel_speedups": s2mel}
