"""The fast profile and its knobs: which apply to a request, and whether the device can honour bf16.

Each knob trades fidelity for speed, so none is on by default; ``bench/precision_gates.py``
measures what each costs against upstream's path (docs/indextts.md, "The fast profile").
Where each enters upstream's code (``infer_v2.py``, ``infer_v2_5.py`` and both PyPI
repackagings alike):

``diffusion_steps``, ``cfg_rate``
    upstream writes ``diffusion_steps = 25`` and ``inference_cfg_rate = 0.7`` into its
    generator and passes them to ``s2mel.models["cfm"].inference``; the adapter's interceptor
    on that call (``_batched.py``) replaces them with the request's values.  A rate of 0 makes
    upstream's ``solve_euler`` run its DiT on one row instead of two (the guidance row skipped).
``num_beams``
    a keyword of upstream's ``generation_kwargs`` (upstream pops it, default 3): passed as the
    request's own ``num_beams`` is, and a greedy request's beam search takes it too.
``bf16_weights``
    the GPT's weights in bfloat16 and upstream's ``dtype`` set to it, so that upstream's own
    autocast regions around the GPT (its ``use_fp16``/``use_bf16`` path, which upstream turns
    off on a CPU) run in bfloat16; the s2mel decoder and the vocoder stay in float32.

This module imports only the standard library; torch is handed in by the caller.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any, Union

__all__ = ["FAST", "FAST_BF16", "Knobs", "bf16_problem", "request_knobs", "to_bf16"]


@dataclass(frozen=True)
class Knobs:
    """The knobs in effect for a request; None leaves upstream's own value."""

    diffusion_steps: Union[int, None] = None
    cfg_rate: Union[float, None] = None
    num_beams: Union[int, None] = None

    def facts(self) -> dict[str, Any]:
        """The knobs set, by name (``done.facts["knobs"]``)."""
        return {name: value for name, value in asdict(self).items() if value is not None}

    @property
    def s2mel(self) -> bool:
        """Whether the s2mel call's arguments change (the interceptor must be reached)."""
        return self.diffusion_steps is not None or self.cfg_rate is not None


#: ``profile=fast``: 10 diffusion steps instead of 25, guidance off, one beam instead of three,
#: and (the engine's, where the device has bf16 matrix products) the GPT's weights in bfloat16.
FAST = Knobs(diffusion_steps=10, cfg_rate=0.0, num_beams=1)
FAST_BF16 = True
_PROFILES = {"default": Knobs(), "fast": FAST}


def _overridden(base: Knobs, options: Any) -> Knobs:
    changes = {
        name: getattr(options, name)
        for name in ("diffusion_steps", "cfg_rate", "num_beams")
        if getattr(options, name, None) is not None
    }
    return replace(base, **changes)


def request_knobs(engine_options: Any, request_options: Any) -> tuple[str, Knobs]:
    """The profile and the knobs in effect for a request.

    From the lowest: the engine's profile, the engine's knobs, the request's profile (which
    sets the knobs afresh: ``default`` clears the engine's), the request's knobs.
    """
    profile = getattr(request_options, "profile", None)
    if profile is None:
        profile = str(engine_options.profile)
        base = _overridden(_PROFILES[profile], engine_options)
    else:
        base = _PROFILES[profile]
    return profile, _overridden(base, request_options)


def _cpu_flags() -> Union[set[str], None]:
    """The CPU's feature flags (Linux's /proc/cpuinfo); None where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        return None
    return None


def bf16_problem(torch: Any, device: str) -> Union[str, None]:
    """Why ``device`` cannot run bf16 matrix products at speed, or None when it can."""
    kind = device.split(":")[0]
    if kind == "cuda":
        if torch.cuda.is_bf16_supported():
            return None
        return f"the GPU {torch.cuda.get_device_name(device)} has no bf16 support (torch.cuda.is_bf16_supported)"
    if kind != "cpu":
        return f"bf16 weights are offered on a CPU or a CUDA GPU only, not on {device}"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn), which runs bf16 matrix products on a CPU"
    flags = _cpu_flags()
    if flags is None:
        return f"the CPU's features cannot be read on {sys.platform} (no /proc/cpuinfo), so bf16 support is unknown"
    native = {"avx512_bf16", "amx_bf16"} if os.uname().machine in ("x86_64", "AMD64") else {"bf16"}
    if flags & native:
        return None
    return (
        f"this CPU has no bf16 matrix instructions (none of {', '.join(sorted(native))} in its flags): "
        "bfloat16 would run emulated, slower than float32"
    )


def to_bf16(torch: Any, model: Any) -> None:
    """The GPT's weights in bfloat16 and upstream's ``dtype`` with them (its autocast around the GPT)."""
    norms = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.modules.batchnorm._BatchNorm)
    for module in model.gpt.modules():
        if isinstance(module, norms):
            continue  # a CPU normalises bf16 input with float32 parameters, never the reverse
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if tensor.is_floating_point():
                tensor.data = tensor.data.to(torch.bfloat16)
    model.dtype = torch.bfloat16
