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
    off on a CPU) run in bfloat16 (on a CPU its linear layers in oneDNN's bf16 layout:
    ``_gpt_fast.py``).  The engine's alone: weights load once.
``bf16_s2mel``, ``bf16_vocoder``
    the s2mel decoder's solve (its DiT and WaveNet, ``cfm.inference``) under bfloat16 autocast,
    and the vocoder's wide dense convolutions in bfloat16 (``_precision.py``), entered by the
    same interceptors; their weights stay float32, so a request may set either.

This module imports only the standard library; torch is handed in by the caller.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any, Union

from .. import LoadError, RequestError
from ._upstream import accelerated

__all__ = [
    "BF16_KNOBS",
    "FAST",
    "FAST_BF16",
    "Knobs",
    "apply_bf16",
    "bf16_knob_problem",
    "bf16_problem",
    "check_knobs",
    "device_bf16_problem",
    "knob_facts",
    "request_knobs",
]

log = logging.getLogger("indextts_sidecar.engines.indextts")


@dataclass(frozen=True)
class Knobs:
    """The knobs in effect for a request; None leaves upstream's own value."""

    diffusion_steps: Union[int, None] = None
    cfg_rate: Union[float, None] = None
    num_beams: Union[int, None] = None
    bf16_s2mel: Union[bool, None] = None
    bf16_vocoder: Union[bool, None] = None

    def facts(self) -> dict[str, Any]:
        """The knobs set, by name (``done.facts["knobs"]``)."""
        return {name: value for name, value in asdict(self).items() if value is not None}

    @property
    def s2mel(self) -> bool:
        """Whether the s2mel call or the vocoder's changes (their interceptors must be reached)."""
        return (
            self.diffusion_steps is not None or self.cfg_rate is not None or bool(self.bf16_s2mel or self.bf16_vocoder)
        )


#: ``profile=fast``: 10 diffusion steps instead of 25, guidance off, one beam instead of three,
#: and, where the device has bf16 matrix products, the s2mel decoder and the vocoder's wide
#: convolutions in bfloat16 and (the engine's) the GPT's weights in bfloat16.
FAST = Knobs(diffusion_steps=10, cfg_rate=0.0, num_beams=1, bf16_s2mel=True, bf16_vocoder=True)
FAST_BF16 = True
_PROFILES = {"default": Knobs(), "fast": FAST}
_KNOBS = ("diffusion_steps", "cfg_rate", "num_beams", "bf16_s2mel", "bf16_vocoder")
#: The knobs that need the device's bf16 matrix products.
BF16_KNOBS = ("bf16_s2mel", "bf16_vocoder")


def _overridden(base: Knobs, options: Any) -> Knobs:
    changes = {name: getattr(options, name) for name in _KNOBS if getattr(options, name, None) is not None}
    return replace(base, **changes)


def request_knobs(
    engine_options: Any, request_options: Any, accel: bool = False, bf16: bool = True
) -> tuple[str, Knobs]:
    """The profile and the knobs in effect for a request.

    From the lowest: the engine's profile, the engine's knobs, the request's profile (which
    sets the knobs afresh: ``default`` clears the engine's), the request's knobs.  ``accel``
    (upstream's accelerated GPT, which ignores beams): no beams but a request's own (refused).
    ``bf16`` False (the device has no bf16 matrix products): no ``bf16_s2mel`` nor ``bf16_vocoder``,
    which then come from the profile alone (an explicit one is refused before:
    :func:`bf16_knob_problem`, :func:`check_knobs`).
    """
    profile = getattr(request_options, "profile", None)
    if profile is None:
        profile = str(engine_options.profile)
        base = _overridden(_PROFILES[profile], engine_options)
    else:
        base = _PROFILES[profile]
    knobs = _overridden(base, request_options)
    if accel and getattr(request_options, "num_beams", None) is None:
        knobs = replace(knobs, num_beams=None)
    if not bf16:
        knobs = replace(knobs, bf16_s2mel=None, bf16_vocoder=None)
    return profile, knobs


def knob_facts(
    engine_options: Any, request_options: Any, accel: bool, bf16_weights: bool, bf16: bool = True
) -> dict[str, Any]:
    """What ``done.facts`` says of the profile: its name and the knobs in effect; nothing for a
    request on upstream's path (no knob, no profile)."""
    profile, knobs = request_knobs(engine_options, request_options, accel, bf16)
    named = knobs.facts()
    if bf16_weights:
        named["bf16_weights"] = True
    if not named and profile == "default" == engine_options.profile:
        return {}
    return {"profile": profile, "knobs": named}


def check_knobs(
    engine_options: Any,
    request_options: Any,
    intercept_problem: Union[str, None],
    label: str,
    no_bf16: Union[str, None] = None,
) -> None:
    """Refuse the s2mel knobs where the adapter cannot reach upstream's s2mel call, and a request's
    own ``bf16_s2mel`` or ``bf16_vocoder`` where the device has no bf16 matrix products
    (``no_bf16`` says why)."""
    for name in BF16_KNOBS:
        if getattr(request_options, name, None) and no_bf16 is not None:
            raise RequestError(
                f"{name} cannot be honoured: {no_bf16}", field=f"$.options.{name}", code="invalid_option"
            )
    profile, knobs = request_knobs(engine_options, request_options)
    if knobs.s2mel and intercept_problem is not None:
        name = "diffusion_steps" if knobs.diffusion_steps is not None else "cfg_rate"
        if knobs.diffusion_steps is None and knobs.cfg_rate is None:
            name = "bf16_s2mel" if knobs.bf16_s2mel else "bf16_vocoder"
        raise RequestError(
            f"{name!r} (set by the request, the engine or profile={profile}) needs the adapter to reach "
            f"upstream's s2mel call, which it cannot with the installed {label}: {intercept_problem}",
            field=f"$.options.{name}",
            code="unknown_option",
        )


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


def device_bf16_problem(torch: Any, device: str) -> Union[str, None]:
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


def _bf16_asked(options: Any) -> bool:
    """``bf16_weights``, or (unset) whether the profile turns it on."""
    explicit = options.bf16_weights
    return bool(explicit) if explicit is not None else options.profile == "fast" and FAST_BF16


def bf16_problem(options: Any, model: Any, label: str) -> Union[str, None]:
    """Why the GPT's weights cannot run in bfloat16 (None: they can, or they are not asked for).

    ``model`` None: before it is constructed, the device alone, so that a refusal costs no load.
    Asked explicitly (``bf16_weights=true``) where it cannot be honoured: a typed error naming why.
    """
    if not _bf16_asked(options):
        return None
    torch = sys.modules["torch"]  # imported by upstream's module
    device = getattr(model, "device", None) or options.device or _default_device(torch)
    problem = device_bf16_problem(torch, str(device))
    if problem is None and model is not None:
        if getattr(model, "dtype", None) is not None:
            problem = f"the GPT already runs in {model.dtype} (upstream's fp16/bf16 option)"
        elif accelerated(model) or not hasattr(model, "dtype"):
            problem = f"the installed {label} runs its GPT outside upstream's autocast (use_accel)"
    if problem is not None and options.bf16_weights:
        raise _cannot_honour("bf16_weights", problem)
    return problem


def bf16_knob_problem(options: Any) -> Union[str, None]:
    """Why the engine's device has no bf16 matrix products for ``bf16_s2mel`` and ``bf16_vocoder``
    (None: it has).

    Called at load (torch imported by upstream's module).  The engine's explicit
    ``bf16_s2mel=true`` or ``bf16_vocoder=true`` where it cannot: a typed error naming why.
    """
    torch = sys.modules.get("torch")
    problem: Union[str, None]
    try:
        problem = device_bf16_problem(torch, str(options.device or _default_device(torch)))
    except (AttributeError, RuntimeError) as exc:  # no torch, a stub, a build without these queries
        problem = f"this torch cannot tell whether the device has bf16 matrix products ({type(exc).__name__}: {exc})"
    asked = [name for name in BF16_KNOBS if getattr(options, name, None)]
    if problem is not None and asked:
        raise _cannot_honour(asked[0], problem)
    return problem


def _cannot_honour(option: str, problem: str) -> LoadError:
    """The load's refusal of an engine option the device cannot honour: not retryable."""
    error = LoadError(f"{option} cannot be honoured: {problem}", field=option)
    error.code = "invalid_option"
    error.retryable = False
    return error


def apply_bf16(options: Any, model: Any, label: str) -> bool:
    """The GPT's weights in bfloat16 if asked and possible; whether they are.

    Asked by ``profile=fast`` alone where it is not possible: skipped, with a warning.
    """
    if not _bf16_asked(options):
        return False
    problem = bf16_problem(options, model, label)
    if problem is not None:
        log.warning("profile=fast runs without bf16 weights: %s", problem)
        return False
    torch = sys.modules["torch"]
    norms = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.modules.batchnorm._BatchNorm)
    for module in model.gpt.modules():
        if isinstance(module, norms):
            continue  # a CPU normalises bf16 input with float32 parameters, never the reverse
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if tensor.is_floating_point():
                tensor.data = tensor.data.to(torch.bfloat16)
    model.dtype = torch.bfloat16  # upstream's autocast around its GPT calls
    return True


def _default_device(torch: Any) -> str:
    """The device upstream picks when none is given: CUDA, XPU, MPS, else the CPU."""
    if torch.cuda.is_available():
        return "cuda:0"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if hasattr(torch, "mps") and torch.backends.mps.is_available():
        return "mps"
    return "cpu"
