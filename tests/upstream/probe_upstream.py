"""Run in an upstream venv: checks the upstream names and formulas the adapter relies on.

Prints one line per check and ``ok`` at the end; exits non-zero on the first mismatch.
"""

from __future__ import annotations

import inspect
import math
import sys

from indextts_sidecar.engines import indextts as adapter


def check(what: str, condition: bool) -> None:
    print(("pass " if condition else "FAIL ") + what)
    if not condition:
        sys.exit(1)


def main() -> None:
    from indextts import infer_v2, infer_v2_5
    from indextts.utils import tokenizer

    for module in (infer_v2, infer_v2_5):
        cls = module.IndexTTS2
        init = inspect.getsource(cls.__init__)
        body = inspect.getsource(cls.infer_generator)
        names = (
            *adapter.SPEAKER_CACHE_ATTRIBUTES,
            adapter.SPEAKER_KEY_ATTRIBUTE,
            adapter.EMOTION_CACHE_ATTRIBUTE,
            adapter.EMOTION_KEY_ATTRIBUTE,
        )
        for name in names:
            check(f"{module.__name__}: __init__ sets self.{name}", f"self.{name} = None" in init)
            check(f"{module.__name__}: infer_generator reads self.{name}", f"self.{name}" in body)
        check(f"{module.__name__}: always samples", "do_sample=True" in body)
        for vector in ([0.9, 0, 0, 0, 0, 0, 0, 0.9], [0.1] * 8, [0.0] * 8, [1.0] * 8, [0, 0.2, 0, 0, 0, 0.3, 0, 0]):
            theirs = cls.normalize_emo_vec(None, list(vector))
            ours = adapter.emotion_weights(list(vector), normalize=True)
            check(
                f"{module.__name__}: normalize_emo_vec({vector})",
                all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(theirs, ours, strict=True)),
            )
        params = inspect.signature(cls.infer).parameters
        wanted = {"stream_return", "interval_silence"}
        check(f"{module.__name__}: infer(stream_return, interval_silence)", wanted <= set(params))
    check("infer_v2: takes aux_paths", "aux_paths" in inspect.signature(infer_v2.IndexTTS2.__init__).parameters)
    for lang in adapter.LANGUAGES:
        check(f"tokenizer knows <|{lang}|>", lang in tokenizer.LANGUAGE_DICT)
    check("tokenizer has no 'zhen'", "zhen" not in tokenizer.LANGUAGE_DICT)
    print("ok")


if __name__ == "__main__":
    main()
