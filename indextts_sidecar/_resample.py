"""Streaming sample-rate conversion for requests that ask for a rate.

Linear interpolation, chunk by chunk with state carried across chunk boundaries, so a
streamed request converts exactly as a whole one would.  It is cheap and adds no
dependency; it is not a band-limited resampler (downsampling by a large factor can
alias), so the sidecar only resamples when a request asks for ``sample_rate``, and a
parent that needs studio quality should take the native rate and resample itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LinearResampler"]


class LinearResampler:
    def __init__(self, source_rate: int, target_rate: int) -> None:
        self._step = source_rate / target_rate  # input samples per output sample
        self._position = 0.0  # of the next output sample, relative to self._pending[0]
        self._pending: npt.NDArray[Any] = np.zeros(0, dtype=np.float64)

    def feed(self, chunk: Any) -> bytes:
        """Convert the next int16 chunk; returns the int16 samples that are now determined."""
        samples = np.frombuffer(memoryview(chunk).cast("B"), dtype="<i2").astype(np.float64)
        x = np.concatenate((self._pending, samples))
        last = len(x) - 1
        if last < self._position:
            self._pending = x
            return b""
        count = int((last - self._position) // self._step) + 1
        positions = self._position + np.arange(count) * self._step
        left = positions.astype(np.int64)
        fraction = positions - left
        right = np.minimum(left + 1, last)
        y = x[left] * (1.0 - fraction) + x[right] * fraction
        following = self._position + count * self._step
        keep = min(int(following), last)
        self._pending = x[keep:]
        self._position = following - keep
        converted: bytes = np.clip(np.rint(y), -32768, 32767).astype("<i2").tobytes()
        return converted
