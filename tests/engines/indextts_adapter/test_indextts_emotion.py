"""Emotion weights as upstream's web UI scales them (engines/indextts/_emotion.py)."""

from __future__ import annotations

import math

import pytest

from indextts_sidecar.engines import indextts as adapter


def test_emotion_weights_follow_upstreams_ui() -> None:
    # Upstream's normalize_emo_vec: a bias per emotion, then the sum capped at 0.8.
    upstream_bias = [0.9375, 0.875, 1.0, 1.0, 0.9375, 0.9375, 0.6875, 0.5625]
    capped = [b * 0.8 / sum(upstream_bias) for b in upstream_bias]
    assert adapter.emotion_weights([1.0] * 8, normalize=True) == pytest.approx(capped)
    assert math.fsum(adapter.emotion_weights([1.0] * 8, normalize=True)) == pytest.approx(0.8)
    assert adapter.emotion_weights([0.0] * 7 + [0.5], normalize=True) == [0.0] * 7 + [0.28125]
    assert adapter.emotion_weights([0.2] * 8, normalize=False) == [0.2] * 8
