"""The fast profile's bfloat16 regions around upstream's s2mel solve and vocoder.

Two request knobs (``_profile.py``), entered by the interceptors of :mod:`._batched` on the
one model call each concerns; the weights stay float32, so a request may set either:

``bf16_s2mel``
    the CFM's solve (its DiT and WaveNet) under torch's bfloat16 autocast: matrix products
    and convolutions in bf16, normalisations and softmax in float32, as autocast decides.
``bf16_vocoder``
    BigVGAN's dense convolutions with at least :data:`VOCODER_MIN_CHANNELS` channels in and
    out in bfloat16, the input cast to bf16 and the output back; everything else (the
    transposed upsampling convolutions, the anti-aliased Snake activations and their
    filters, the narrow last stages) in float32.  Autocast over the whole vocoder ran
    slower than float32 on a CPU with AMX (its depthwise filters and narrow layers lose
    there) and lost the most precision; these convolutions are most of its arithmetic.
    Their bf16 weights are cast once, on first use, and kept beside the float32 ones.

Only one thread runs the model at a time (the sidecar's engine thread; a batch's lockstep),
so a region may swap a module's ``forward`` for the length of one call.  This module imports
no torch at import time; it is handed in or imported when a region is entered.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["VOCODER_MIN_CHANNELS", "autocast_bf16", "vocoder_bf16"]

#: The narrowest dense convolution of the vocoder that ``bf16_vocoder`` runs in bfloat16: on a
#: CPU with AMX the narrower ones (BigVGAN's last stages, 48 and 24 channels over long
#: signals) ran no faster in bf16 (docs/indextts.md, "The fast profile").
VOCODER_MIN_CHANNELS = 96

#: Each convolution's bfloat16 weight and bias, cast on first use.
_BF16: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()


def _torch() -> Any:
    return importlib.import_module("torch")


@contextmanager
def autocast_bf16(on: bool, tensor: Any) -> Iterator[bool]:
    """bfloat16 autocast on ``tensor``'s device where ``on`` (yields ``on``), else nothing
    (``tensor`` untouched: a call passed through stays as upstream made it)."""
    if not on:
        yield False
        return
    torch = _torch()
    with torch.autocast(tensor.device.type, dtype=torch.bfloat16):
        yield True


def _convolutions(vocoder: Any, torch: Any) -> list[Any]:
    modules = getattr(vocoder, "modules", None)
    if not callable(modules):
        return []
    return [
        m
        for m in modules()
        if isinstance(m, torch.nn.Conv1d)
        and m.groups == 1
        and m.padding_mode == "zeros"
        and min(m.in_channels, m.out_channels) >= VOCODER_MIN_CHANNELS
        and m.weight.dtype == torch.float32
    ]


def _bf16_forward(torch: Any, module: Any) -> Any:
    weights = _BF16.get(module)
    if weights is None:
        with torch.no_grad():
            bias = None if module.bias is None else module.bias.detach().to(torch.bfloat16)
            weights = (module.weight.detach().to(torch.bfloat16), bias)
        _BF16[module] = weights
    weight, bias = weights
    conv1d = torch.nn.functional.conv1d
    stride, padding, dilation = module.stride, module.padding, module.dilation

    def forward(x: Any) -> Any:
        return conv1d(x.to(torch.bfloat16), weight, bias, stride, padding, dilation, 1).to(x.dtype)

    return forward


@contextmanager
def vocoder_bf16(vocoder: Any, on: bool) -> Iterator[None]:
    """The vocoder's dense convolutions in bfloat16 for the length of the region, where ``on``."""
    if not on:
        yield
        return
    torch = _torch()
    swapped = []
    try:
        for module in _convolutions(vocoder, torch):
            swapped.append((module, vars(module).get("forward")))
            module.forward = _bf16_forward(torch, module)
        yield
    finally:
        for module, before in swapped:
            if before is None:
                del module.forward
            else:
                module.forward = before
