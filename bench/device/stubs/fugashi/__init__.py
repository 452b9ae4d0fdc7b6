"""Stand-in for ``fugashi`` on the GPU machine (bench/gpu_run.sh only, never installed).

IndexTTS-2.5 builds a Japanese G2P processor when it loads (indextts/utils/ja_g2p.py), whose
``fugashi.Tagger()`` needs the unidic-lite dictionary: 47 MB, too much to carry beside the
rest.  The benchmark speaks English only, so the tagger is never called; if it were, this
stand-in raises instead of producing a wrong reading.
"""

from __future__ import annotations

from typing import Any, NoReturn


class Tagger:
    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def __call__(self, text: str) -> NoReturn:
        raise RuntimeError("the GPU benchmark's fugashi stand-in has no Japanese dictionary")
