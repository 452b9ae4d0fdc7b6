"""Streaming sample-rate conversion for requests that ask for a rate.

Two converters, both chunk by chunk with state carried across chunk boundaries, so a
streamed request converts exactly as a whole one would:

* :class:`BlockResampler` wraps a band-limited whole-signal resampler (torchaudio's
  Kaiser-windowed sinc ``resample``) and feeds it blocks aligned to the rate ratio, each with
  enough context on both sides that its output equals that of the whole signal.  Used
  when torchaudio is already loaded in this process (the IndexTTS engine's venv always
  has it; importing torch only to resample would cost seconds and hundreds of MB).
* :class:`LinearResampler`: linear interpolation, cheap and dependency-free, but not
  band-limited (downsampling can alias audibly).  The fallback elsewhere.

:func:`resampled` converts an engine's chunk iterator with whichever applies.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol, Union

import numpy as np
import numpy.typing as npt

__all__ = ["BlockResampler", "LinearResampler", "Resampler", "make_resampler", "resampled"]

_FloatArray = npt.NDArray[np.float32]
#: ``resample(samples, source_rate, target_rate)`` over a whole (float32, mono) signal.
WholeResample = Callable[[_FloatArray, int, int], _FloatArray]


#: The band-limited filter (librosa's "kaiser_best"): a Kaiser-windowed sinc with 64 zero
#: crossings a side, cut off at 0.9476 of the lower Nyquist frequency.  Measured through
#: torchaudio, 22050 -> 16000 Hz: a 10 kHz tone down by 105 dB, 7.2 kHz (0.9 of the new
#: Nyquist) down by 0.02 dB; torchaudio's default filter gives 45 dB and 2.4 dB.
ZERO_CROSSINGS = 64
_ROLLOFF = 0.9475937167399596
_KAISER_BETA = 14.769656459379492


class Resampler(Protocol):
    def feed(self, chunk: Any) -> bytes: ...

    def flush(self) -> bytes: ...


def _to_pcm16(samples: npt.NDArray[Any]) -> bytes:
    converted: bytes = np.clip(np.rint(samples), -32768, 32767).astype("<i2").tobytes()
    return converted


class LinearResampler:
    def __init__(self, source_rate: int, target_rate: int) -> None:
        self._rates = (source_rate, target_rate)
        self._step = source_rate / target_rate  # input samples per output sample
        self._position = 0.0  # of the next output sample, relative to self._pending[0]
        self._pending: npt.NDArray[Any] = np.zeros(0, dtype=np.float64)
        self._received = 0
        self._emitted = 0

    def feed(self, chunk: Any) -> bytes:
        """Convert the next int16 chunk; returns the int16 samples that are now determined."""
        samples = np.frombuffer(memoryview(chunk).cast("B"), dtype="<i2").astype(np.float64)
        self._received += len(samples)
        out = self._convert(samples)
        self._emitted += len(out) // 2
        return out

    def flush(self) -> bytes:
        """The signal ends (zeros beyond it): the last samples, to ``ceil(n * target / source)`` in all."""
        source, target = self._rates
        wanted = -(-self._received * target // source) - self._emitted
        if wanted <= 0:
            return b""
        out = self._convert(np.zeros(math.ceil(self._step) + 1, dtype=np.float64))[: wanted * 2]
        self._emitted += len(out) // 2
        return out

    def _convert(self, samples: npt.NDArray[Any]) -> bytes:
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
        return _to_pcm16(y)


class BlockResampler:
    """A whole-signal resampler made streaming.

    With the rates reduced to ``p`` input and ``q`` output samples per period, a block
    of ``k * p`` input samples maps onto exactly ``k * q`` output samples, with the same
    filter phases as in the whole signal.  Each block is resampled with ``context``
    samples of real signal on each side (zeros before the start, as the whole-signal
    resampler pads), and only its own span of output is kept; ``context`` must cover the
    filter's half-width.  :meth:`flush` ends the signal and trims the output to the
    whole signal's length, ``ceil(n * q / p)``.
    """

    def __init__(self, source_rate: int, target_rate: int, resample: WholeResample, *, zero_crossings: int = 8) -> None:
        divisor = math.gcd(source_rate, target_rate)
        self._p, self._q = source_rate // divisor, target_rate // divisor
        self._source, self._target = source_rate, target_rate
        self._resample = resample
        # A windowed sinc with ``zero_crossings`` on each side at the lower of the two rates
        # spans that many periods of it, in input samples: the context, in whole periods.
        wanted = math.ceil(zero_crossings * self._p / (min(self._p, self._q) * _ROLLOFF)) + 1
        self._context = self._p * math.ceil(max(wanted, 64) / self._p)
        self._pending: _FloatArray = np.zeros(self._context, dtype=np.float32)
        self._received = 0
        self._emitted = 0

    def feed(self, chunk: Any) -> bytes:
        samples = np.frombuffer(memoryview(chunk).cast("B"), dtype="<i2").astype(np.float32)
        self._received += len(samples)
        self._pending = np.concatenate((self._pending, samples))
        return self._convert(final=False)

    def flush(self) -> bytes:
        return self._convert(final=True)

    def _convert(self, *, final: bool) -> bytes:
        c, p, q = self._context, self._p, self._q
        if final:
            # The signal ends: zeros beyond it, and enough of them to close the last period.
            body = len(self._pending) - c
            padded = p * math.ceil(max(body, 0) / p)
            self._pending = np.concatenate((self._pending, np.zeros(padded - body + c, dtype=np.float32)))
        usable = (len(self._pending) - 2 * c) // p * p
        if usable <= 0:
            return b""
        block = self._pending[: c + usable + c]
        out = self._resample(block, self._source, self._target)
        first = c // p * q
        kept = out[first : first + usable // p * q]
        self._pending = self._pending[usable:]
        if final:
            total = math.ceil(self._received * q / p)
            kept = kept[: max(0, total - self._emitted)]
        self._emitted += len(kept)
        return _to_pcm16(kept)


def _torchaudio_resample() -> Union[WholeResample, None]:
    """torchaudio's band-limited resampler, only if torch is already loaded here."""
    if "torch" not in sys.modules:
        return None
    try:
        torch: Any = importlib.import_module("torch")
        functional: Any = importlib.import_module("torchaudio.functional")
    except ImportError:
        return None

    def resample(samples: _FloatArray, source: int, target: int) -> _FloatArray:
        with torch.no_grad():
            out = functional.resample(
                torch.from_numpy(samples),
                source,
                target,
                lowpass_filter_width=ZERO_CROSSINGS,
                rolloff=_ROLLOFF,
                resampling_method="sinc_interp_kaiser",
                beta=_KAISER_BETA,
            )
        result: _FloatArray = out.numpy()
        return result

    return resample


def make_resampler(source_rate: int, target_rate: int) -> Resampler:
    """The best converter available in this process (see the module's docstring)."""
    whole = _torchaudio_resample()
    if whole is not None:
        return BlockResampler(source_rate, target_rate, whole, zero_crossings=ZERO_CROSSINGS)
    return LinearResampler(source_rate, target_rate)


def resampled(chunks: Iterator[Any], source_rate: int, target_rate: int) -> Iterator[bytes]:
    """``chunks`` (int16 mono) converted to ``target_rate``; closing it closes ``chunks``."""
    converter = make_resampler(source_rate, target_rate)
    try:
        for chunk in chunks:
            out = converter.feed(chunk)
            if out:
                yield out
        tail = converter.flush()
        if tail:
            yield tail
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
