"""Model output as int16 PCM: torch tensors, numpy arrays or sequences, on either float scale.

numpy is imported on first use, never when the engine's module is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import EngineError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["UNIT_SCALE_CEILING", "as_numpy", "peak", "to_pcm16"]

#: Streamed chunks louder than this cannot be on the [-1, 1] scale.
UNIT_SCALE_CEILING = 4.0


def to_pcm16(samples: Any, *, unit_scale: bool) -> npt.NDArray[Any]:
    """One chunk of model output as contiguous little-endian int16 samples.

    Accepts a torch tensor (any device), a numpy array or a sequence, mono in any of the
    shapes ``(n,)``, ``(1, n)`` and ``(n, 1)``.  int16 passes through untouched.  Floats are
    rounded to the nearest integer and clipped, after scaling by 32768 when ``unit_scale``,
    so int16 -> float -> int16 round-trips exactly on either scale.
    """
    import numpy as np

    array = as_numpy(samples)
    if array.ndim == 2 and 1 in array.shape:
        array = array.reshape(-1)
    elif array.ndim != 1:
        raise EngineError(f"the model returned audio of shape {array.shape}, not mono", code="internal")
    out: npt.NDArray[Any]
    if array.dtype == np.int16:
        out = np.ascontiguousarray(array, dtype="<i2")
    elif array.dtype.kind in "iub":
        out = np.clip(array, -32768, 32767).astype("<i2")
    else:
        # float32 holds every int16 exactly, and scaling by 32768 is exact in binary floats.
        floats = array.astype(np.float64 if array.dtype.itemsize > 4 else np.float32)
        if unit_scale:
            np.multiply(floats, 32768.0, out=floats)
        np.nan_to_num(floats, copy=False, nan=0.0, posinf=32767.0, neginf=-32768.0)
        out = np.clip(np.rint(floats), -32768, 32767).astype("<i2")
    return out


def as_numpy(samples: Any) -> npt.NDArray[Any]:
    import numpy as np

    if isinstance(samples, np.ndarray):
        return samples
    result: npt.NDArray[Any]
    value = samples
    for step in ("detach", "cpu"):
        method = getattr(value, step, None)
        if callable(method):
            value = method()
    to_numpy = getattr(value, "numpy", None)
    if callable(to_numpy):
        try:
            result = np.asarray(to_numpy())
        except TypeError:  # bfloat16 and friends have no numpy dtype
            result = np.asarray(value.float().numpy())
        return result
    result = np.asarray(value)
    return result


def peak(array: npt.NDArray[Any]) -> float:
    import numpy as np

    if not array.size or array.dtype.kind != "f":
        return 0.0
    return float(np.max(np.abs(np.nan_to_num(array))))
