"""Streaming sample-rate conversion for requests that ask for a rate.

Every converter is band-limited and works chunk by chunk with state carried across
chunk boundaries, so a streamed request converts exactly as a whole one would.
:func:`make_resampler` picks the first available of:

* ``soxr`` (the ``audio`` extra): libsoxr's streaming resampler at its "very high"
  quality, the fastest and best of the three.
* ``torchaudio``: its Kaiser-windowed sinc ``resample``, only when torch is already
  loaded in this process (the IndexTTS engine's venv always has it; importing torch only
  to resample would cost seconds and hundreds of MB).
* ``numpy``: the same Kaiser-windowed sinc filter, evaluated here with numpy alone.

The last two are whole-signal resamplers made streaming by :class:`BlockResampler`.
A request's :class:`~._jobs.Sink` feeds its engine's chunks to one of them, and moves the
word timings among them to the new rate (:func:`rescale_words`).
"""

from __future__ import annotations

import functools
import importlib
import math
import sys
from collections.abc import Callable, Iterable
from typing import Any, Protocol, Union

import numpy as np
import numpy.typing as npt

from .protocol import WordSpan

__all__ = [
    "METHODS",
    "BlockResampler",
    "Resampler",
    "SoxrResampler",
    "available_methods",
    "make_resampler",
    "rescale_position",
    "rescale_words",
    "sinc_resample",
]

_FloatArray = npt.NDArray[np.float32]
#: ``resample(samples, source_rate, target_rate)`` over a whole (float32, mono) signal.
WholeResample = Callable[[_FloatArray, int, int], _FloatArray]

#: Converters in order of preference.
METHODS = ("soxr", "torchaudio", "numpy")

#: The band-limited filter (librosa's "kaiser_best"): a Kaiser-windowed sinc with 64 zero
#: crossings a side, cut off at 0.9476 of the lower Nyquist frequency.  Measured through
#: torchaudio, 22050 -> 16000 Hz: a 10 kHz tone down by 105 dB, 7.2 kHz (0.9 of the new
#: Nyquist) down by 0.02 dB; torchaudio's default filter gives 45 dB and 2.4 dB.
ZERO_CROSSINGS = 64
_ROLLOFF = 0.9475937167399596
_KAISER_BETA = 14.769656459379492
#: Output samples computed per numpy step: bounds the temporary (outputs x taps) matrix.
_NUMPY_STEP = 4096


class Resampler(Protocol):
    def feed(self, chunk: Any) -> bytes: ...

    def flush(self) -> bytes: ...


def _to_pcm16(samples: npt.NDArray[Any]) -> bytes:
    converted: bytes = np.clip(np.rint(samples), -32768, 32767).astype("<i2").tobytes()
    return converted


def _int16(chunk: Any) -> npt.NDArray[np.int16]:
    return np.frombuffer(memoryview(chunk).cast("B"), dtype="<i2")


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
        samples = _int16(chunk).astype(np.float32)
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


class SoxrResampler:
    """libsoxr's own streaming converter (``soxr.ResampleStream``), "very high" quality."""

    def __init__(self, source_rate: int, target_rate: int) -> None:
        import soxr  # type: ignore[import-untyped]

        self._stream = soxr.ResampleStream(source_rate, target_rate, 1, dtype="float32", quality="VHQ")

    def feed(self, chunk: Any) -> bytes:
        samples = _int16(chunk).astype(np.float32)
        return _to_pcm16(self._stream.resample_chunk(samples, last=False))

    def flush(self) -> bytes:
        return _to_pcm16(self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True))


# ------------------------------------------------------------------ numpy sinc


class _SincKernels:
    """The Kaiser-windowed sinc's taps for each of the ``q`` output phases of one rate pair.

    Output sample ``j`` lies at input position ``t = j * p / q``; it is the sum of the
    input samples ``floor(t) - half + 1 ... floor(t) + half`` weighted by the low-pass
    impulse response at their distance from ``t``.  That distance depends only on the
    phase ``j mod q``, so the weights are computed once per phase.
    """

    def __init__(self, p: int, q: int) -> None:
        self.p, self.q = p, q
        cutoff = _ROLLOFF * min(1.0, q / p)  # as a fraction of the input's Nyquist frequency
        reach = ZERO_CROSSINGS / cutoff  # the window's half-width, in input samples
        self.half = math.ceil(reach)
        phases = np.arange(q)
        self.floor = phases * p // q  # floor(t) of each phase, within its period
        fraction = phases * p / q - self.floor
        taps = np.arange(-self.half + 1, self.half + 1)
        distance = taps[None, :] - fraction[:, None]  # input position minus t
        ratio = np.clip(distance / reach, -1.0, 1.0)
        window = np.i0(_KAISER_BETA * np.sqrt(1.0 - ratio * ratio)) / np.i0(_KAISER_BETA)
        window[np.abs(distance) > reach] = 0.0
        self.weights = (cutoff * np.sinc(cutoff * distance) * window).astype(np.float32)


@functools.lru_cache(maxsize=8)
def _kernels_for(p: int, q: int) -> _SincKernels:
    """Kept for the rate pairs in use: an odd pair (22050 -> 16001 Hz) has 16001 phases, ~12 MB."""
    return _SincKernels(p, q)


def sinc_resample(samples: _FloatArray, source_rate: int, target_rate: int) -> _FloatArray:
    """Resample a whole float32 signal with the Kaiser-windowed sinc, in numpy alone.

    The signal is taken as zero outside its ends; the result has ``ceil(n * target /
    source)`` samples.  The same filter as torchaudio's ``sinc_interp_kaiser`` with this
    module's parameters.
    """
    divisor = math.gcd(source_rate, target_rate)
    p, q = source_rate // divisor, target_rate // divisor
    kernels = _kernels_for(p, q)
    half = kernels.half
    count = math.ceil(len(samples) * q / p)
    padded = np.concatenate(
        (np.zeros(half, dtype=np.float32), samples.astype(np.float32, copy=False), np.zeros(half + p, dtype=np.float32))
    )
    out = np.empty(count, dtype=np.float32)
    taps = np.arange(2 * half)
    for start in range(0, count, _NUMPY_STEP):
        j = np.arange(start, min(count, start + _NUMPY_STEP))
        phase = j % q
        # Index in ``padded`` of each output's first tap: floor(t) - half + 1, shifted by the padding.
        first = (j // q) * p + kernels.floor[phase] + 1
        window = padded[first[:, None] + taps[None, :]]
        out[start : start + len(j)] = np.einsum("ij,ij->i", window, kernels.weights[phase])
    return out


# --------------------------------------------------------------------- choice


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


def _soxr_available() -> bool:
    try:
        importlib.import_module("soxr")
    except ImportError:
        return False
    return True


def available_methods() -> list[str]:
    """The converters this process can use, best first."""
    found = []
    if _soxr_available():
        found.append("soxr")
    if _torchaudio_resample() is not None:
        found.append("torchaudio")
    found.append("numpy")
    return found


def make_resampler(source_rate: int, target_rate: int, method: Union[str, None] = None) -> Resampler:
    """A streaming converter: ``method`` (one of :data:`METHODS`), or the best available."""
    chosen = method or available_methods()[0]
    if chosen == "soxr":
        return SoxrResampler(source_rate, target_rate)
    if chosen == "torchaudio":
        whole = _torchaudio_resample()
        if whole is None:
            raise LookupError("torchaudio resampling needs torch already loaded and torchaudio installed")
        return BlockResampler(source_rate, target_rate, whole, zero_crossings=ZERO_CROSSINGS)
    if chosen == "numpy":
        return BlockResampler(source_rate, target_rate, sinc_resample, zero_crossings=ZERO_CROSSINGS)
    raise ValueError(f"unknown resampling method {method!r}; expected one of {', '.join(METHODS)}")


def rescale_position(position: int, source_rate: int, target_rate: int) -> int:
    """Sample ``position`` at ``source_rate`` as a position at ``target_rate``: the last output
    sample at or before its time (rounded down, always the same way).

    Rounding down keeps a position below the input's length below the output's: sample
    ``n - 1`` of ``n`` lands below ``n * target / source``, the converted signal's length.
    """
    return position * target_rate // source_rate


def rescale_words(words: Iterable[WordSpan], source_rate: int, target_rate: int) -> tuple[WordSpan, ...]:
    """``words`` with their sample positions at ``target_rate`` (:func:`rescale_position`).

    Every word stays, with its characters; ``end >= start`` holds as it held before, since the
    rounding never reverses an order.
    """
    return tuple(
        WordSpan(
            word.start_char,
            word.end_char,
            rescale_position(word.start, source_rate, target_rate),
            rescale_position(word.end, source_rate, target_rate),
        )
        for word in words
    )
