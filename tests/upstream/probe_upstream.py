"""Run in an upstream venv: checks the upstream names and formulas the adapter relies on.

Prints one line per check and ``ok`` at the end; exits non-zero on the first mismatch.
"""

from __future__ import annotations

import inspect
import math
import sys
from typing import Union

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
    check_resampling()
    print("ok")


def check_resampling() -> None:
    """In this venv the sidecar resamples band-limited (soxr from upstream's pins, else torchaudio,
    which torch being loaded makes available), streamed as the whole signal would be."""
    import numpy as np
    import torch  # loaded, as the IndexTTS engine loads it  # noqa: F401

    from indextts_sidecar._resample import _torchaudio_resample, available_methods, make_resampler

    methods = available_methods()
    check(f"resamplers here: {methods}", methods[0] in ("soxr", "torchaudio") and "torchaudio" in methods)
    whole = _torchaudio_resample()
    assert whole is not None
    rng = np.random.default_rng(3)

    def streamed(x: np.ndarray, source: int, target: int, method: str) -> np.ndarray:
        converter = make_resampler(source, target, method)
        out = bytearray()
        position = 0
        while position < len(x):
            size = int(rng.integers(1, 5000))
            out += converter.feed(x[position : position + size].astype("<i2").tobytes())
            position += size
        out += converter.flush()
        return np.frombuffer(bytes(out), "<i2")

    def attempt(x: np.ndarray, source: int, target: int, state: dict) -> tuple[np.ndarray, np.ndarray]:
        """The whole signal's output and the streamed one, the chunk sizes drawn from ``state``."""
        rng.bit_generator.state = state
        reference = np.clip(np.rint(whole(x.astype(np.float32), source, target)), -32768, 32767).astype(int)
        return reference, streamed(x, source, target, "torchaudio").astype(int)

    def worst(a: np.ndarray, b: np.ndarray) -> Union[int, None]:
        return int(np.abs(a - b).max()) if len(a) == len(b) else None

    for source, target in ((22050, 16000), (22050, 24000), (22050, 8000), (22050, 44100)):
        x = (rng.standard_normal(source * 2) * 3000).astype("<i2")
        state = rng.bit_generator.state
        reference, got = attempt(x, source, target, state)
        first = worst(got, reference)
        verdict = first is not None and first <= 1
        said = f"largest difference {first}"
        if not verdict:
            # CI saw this fail twice in some thirty runs (a difference of 30 LSB), never here.
            # The same inputs again: if torch's own outputs differ between the two runs, that
            # was torch not reproducing itself, not the streaming being wrong.
            again, got_again = attempt(x, source, target, state)
            second = worst(got_again, again)
            moved = worst(again, reference) != 0 or worst(got_again, got) != 0
            verdict = moved and second is not None and second <= 1
            said += f"; again with the same input: {second}, and torch's outputs " + (
                "differed between the two runs" if moved else "were the same"
            )
        # Said in full, so that a failure tells a length mismatch from a value one.
        check(
            f"torchaudio: streamed {source} -> {target} Hz equals the whole signal's (within 1 LSB; "
            f"{len(got)} against {len(reference)} samples, {said})",
            verdict,
        )
    t = np.arange(22050 * 2) / 22050

    def gain_db(frequency: float, method: str) -> float:
        x = np.rint(10000 * np.sin(2 * np.pi * frequency * t))
        y = streamed(x, 22050, 16000, method)[2000:-2000].astype(float)
        return float(20 * np.log10(np.sqrt(np.mean(y**2)) / (10000 / np.sqrt(2))))

    for method in methods:
        stop, edge = gain_db(10000, method), gain_db(0.9 * 8000, method)
        check(f"{method} 22050 -> 16000 Hz: a 10 kHz tone is down {-stop:.1f} dB (>= 60)", stop <= -60)
        check(f"{method} 22050 -> 16000 Hz: 7.2 kHz within 0.1 dB ({edge:.3f} dB)", abs(edge) <= 0.1)


if __name__ == "__main__":
    main()
