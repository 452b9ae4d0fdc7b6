"""Small real audio clips for the voice store's tests, encoded with soundfile (the test extra)."""

from __future__ import annotations

import io

import numpy as np
import soundfile


def clip(seconds: float = 0.05, *, rate: int = 24000, fmt: str = "WAV", seed: int = 0) -> bytes:
    """``seconds`` of noise as a ``fmt`` file (WAV, FLAC, OGG, MP3...); a different ``seed``, different bytes."""
    samples = np.random.default_rng(seed).uniform(-0.3, 0.3, round(seconds * rate)).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=fmt, subtype="PCM_16" if fmt in ("WAV", "FLAC") else None)
    return out.getvalue()
