"""Emotion requests as upstream takes them: checks of an emotion vector, and the ``infer``
keywords each kind of emotion becomes (docs/indextts.md explains the semantics).
"""

from __future__ import annotations

import math
from typing import Any

from ...protocol import EMOTION_NAMES, EmotionAudio, EmotionText, EmotionVector
from .. import RequestError

__all__ = ["EMOTION_BIAS", "EMOTION_SUM_CAP", "check_vector", "emotion_kwargs", "emotion_weights"]

#: Tolerance of the emotion-vector sum rule (float rounding of weights like 0.1 + 0.2).
_SUM_TOLERANCE = 1e-6
#: Upstream's web UI scales each emotion weight by these (happy ... calm) and then caps the
#: sum at 0.8 (``IndexTTS2.normalize_emo_vec``), to de-emphasise emotions that sound odd.
EMOTION_BIAS = (0.9375, 0.875, 1.0, 1.0, 0.9375, 0.9375, 0.6875, 0.5625)
EMOTION_SUM_CAP = 0.8


def emotion_weights(values: list[float], *, normalize: bool) -> list[float]:
    """The weights sent upstream: with ``normalize``, biased and capped as upstream's web UI does."""
    if not normalize:
        return list(values)
    biased = [value * bias for value, bias in zip(values, EMOTION_BIAS, strict=True)]
    total = math.fsum(biased)
    if total > EMOTION_SUM_CAP:
        biased = [value * (EMOTION_SUM_CAP / total) for value in biased]
    return biased


def check_vector(emotion: EmotionVector, *, normalize: bool) -> None:
    values = emotion.values()
    for name, value in zip(EMOTION_NAMES, values, strict=True):
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise RequestError(f"emotion weight {name} must be in [0, 1], got {value}", field=f"$.emotion.{name}")
    total = math.fsum(values)
    if not normalize and total > 1.0 + _SUM_TOLERANCE:
        raise RequestError(
            f"emotion weights sum to {total:g}; the sum must be at most 1 (IndexTTS mixes "
            "vector + (1 - sum) * speaker, so a larger sum inverts the speaker's own emotion)",
            field="$.emotion",
        )
    if not math.isfinite(emotion.alpha):
        raise RequestError(f"emotion alpha must be a finite number, got {emotion.alpha}", field="$.emotion.alpha")


def _clamp01(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


def emotion_kwargs(emotion: Any, *, normalize: bool) -> dict[str, Any]:
    if isinstance(emotion, EmotionVector):
        weights = emotion_weights(list(emotion.values()), normalize=normalize)
        return {"emo_vector": weights, "emo_alpha": _clamp01(emotion.alpha)}
    if isinstance(emotion, EmotionAudio):
        return {"emo_audio_prompt": emotion.path, "emo_alpha": float(emotion.alpha)}
    if isinstance(emotion, EmotionText):
        return {"use_emo_text": True, "emo_text": emotion.text, "emo_alpha": _clamp01(emotion.alpha)}
    return {}
