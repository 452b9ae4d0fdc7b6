"""s2mel's same-output speed-ups (issue 42, point 1; docs/indextts.md, "The same output, faster").

Upstream's flow-matching solver (``cfm.solve_euler``) runs its DiT over the voice's reference
mel and the new frames together, at every step, and keeps only the new frames: after each
step it zeroes the reference's part of the estimate, and ``infer`` cuts it off the result.
Two things are taken out here, on the loaded instance only (upstream's files and classes stay
untouched, as :mod:`._gpt_fast` does):

**The tail over the new frames only** (``tail_crop``). After its transformer, the DiT runs a
per-frame skip projection, a WaveNet (convolutions over time), a final per-frame layer and a
1x1 convolution: about a third of a step on a CPU, half of it over reference frames whose
result is thrown away. Here the tail starts ``margin`` frames before the new ones (``margin``:
the WaveNet's reach, the sum of its convolutions' widths less one) and the estimate is padded
back with zeros to the full length. A frame's value at the tail's end depends only on the
frames within the reach, so each new frame gets what upstream computes; the frames in the
margin and before it are wrong or zero, and upstream zeroes them. The transformer, whose
attention mixes every frame, runs over all of them as before.

**Weight norm once** (``weight_norm_once``). The DiT's weight-normed layers (its WaveNet, its
input and final projections) recompute ``g * v / |v|`` at every forward, 40 times a step.
Here torch's ``remove_weight_norm`` computes it once into the weight: the same tensor as the
hook's, so the same output bit for bit.

Neither applies to a DiT compiled by ``use_torch_compile``: the report says so.

The products over fewer frames may add in another order (a different blocking), so the
estimate can differ in its last bits: audio within one int16 step, greedy codes untouched (the
GPT runs before). tests/upstream/test_s2mel_fast.py checks both on the tiny fixtures;
``bench/bench_s2mel_step.py`` times them at full size.
"""

from __future__ import annotations

import functools
import importlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = ["PARTS", "install", "uninstall"]

#: The speed-ups, by name: what ``install`` reports on.
PARTS = ("tail_crop", "weight_norm_once")


@dataclass
class _Installed:
    """What :func:`install` put on one CFM (the key it is kept under), to take it off again."""

    #: (module, attribute, its instance value before or None) for each attribute set.
    attributes: list[tuple[Any, str, Any]] = field(default_factory=list)
    #: (module, g, v, dim) for each weight norm folded into its weight.
    norms: list[tuple[Any, Any, Any, Any]] = field(default_factory=list)


#: The crop in effect while a solver runs, shared by the wrappers of one CFM (one solver at a
#: time per model: the engine is driven by one thread).
@dataclass
class _Crop:
    margin: int
    start: int = 0


_INSTALLED: weakref.WeakKeyDictionary[Any, _Installed] = weakref.WeakKeyDictionary()


def install(model: Any, *, parts: Sequence[str] = PARTS) -> dict[str, str]:
    """Put the speed-ups named in ``parts`` on ``model``'s s2mel: each part's name, and ``on``,
    ``off`` (not in ``parts``) or why it is not on.  :func:`uninstall` takes them off."""
    report = dict.fromkeys(PARTS, "off")
    cfm = _cfm(model)
    if cfm is None:
        why = "its s2mel has no CFM estimator"
        return {part: why if part in parts else "off" for part in PARTS}
    if hasattr(cfm.estimator, "_orig_mod"):  # torch.compile's wrapper: a traced graph, not these modules
        why = "its DiT is compiled (use_torch_compile)"
        return {part: why if part in parts else "off" for part in PARTS}
    if cfm in _INSTALLED:
        uninstall(model)
    installed = _Installed()
    _INSTALLED[cfm] = installed
    if "tail_crop" in parts:
        report["tail_crop"] = _crop(cfm, installed) or "on"
    if "weight_norm_once" in parts:
        report["weight_norm_once"] = _weight_norm_once(cfm.estimator, installed) or "on"
    return report


def uninstall(model: Any) -> None:
    """Upstream's path again: the wrappers popped, the weight-norm hooks back in place."""
    cfm = _cfm(model)
    installed = _INSTALLED.pop(cfm, None) if cfm is not None else None
    if installed is None:
        return
    for owner, name, before in reversed(installed.attributes):
        if before is None:
            vars(owner).pop(name, None)
        else:
            setattr(owner, name, before)
    for module, g, v, dim in installed.norms:
        _restore_weight_norm(module, g, v, dim)


def _torch() -> Any:
    return importlib.import_module("torch")


def _cfm(model: Any) -> Any:
    models = getattr(getattr(model, "s2mel", None), "models", None)
    try:
        cfm = models["cfm"] if models is not None else None
    except (KeyError, TypeError):
        return None
    return cfm if getattr(cfm, "estimator", None) is not None else None


def _reach(tail: Any) -> Union[int, None]:
    """How many frames back a frame of ``tail``'s output can see: the sum over its convolutions
    of (width - 1) x dilation; None where a convolution strides."""
    torch = _torch()
    reach = 0
    for module in tail.modules():
        if isinstance(module, torch.nn.Conv1d):
            if module.stride[0] != 1:
                return None
            reach += (module.kernel_size[0] - 1) * module.dilation[0]
    return reach


def _crop(cfm: Any, installed: _Installed) -> Union[str, None]:
    estimator = cfm.estimator
    layout = (
        getattr(estimator, "final_layer_type", None) == "wavenet"
        and getattr(estimator, "long_skip_connection", False)
        and not getattr(estimator, "time_as_token", True)
        and not getattr(estimator, "style_as_token", True)
    )
    names = ("skip_linear", "wavenet", "conv2", "final_layer", "res_projection", "conv1")
    if not layout or not all(hasattr(estimator, name) for name in names):
        return "its DiT is not upstream's layout (a WaveNet tail after a long skip, no time or style token)"
    if not callable(getattr(cfm, "solve_euler", None)):
        return "its CFM has no solve_euler"
    reaches = [_reach(getattr(estimator, name)) for name in names[1:]]
    if any(reach is None for reach in reaches):
        return "its DiT's tail has a strided convolution"
    crop = _Crop(margin=sum(reach or 0 for reach in reaches))
    solve, skip = cfm.solve_euler, estimator.skip_linear.forward
    wavenet, conv2 = estimator.wavenet.forward, estimator.conv2.forward
    torch = _torch()

    @functools.wraps(solve)
    def solve_euler(*args: Any, **kwargs: Any) -> Any:
        prompt = kwargs["prompt"] if "prompt" in kwargs else args[2]
        crop.start = max(0, int(prompt.shape[-1]) - crop.margin)
        try:
            return solve(*args, **kwargs)
        finally:
            crop.start = 0

    def skip_linear(x: Any) -> Any:  # [B, T, C]: the transformer's output and the noisy mel
        return skip(x[:, crop.start :] if crop.start else x)

    def wavenet_forward(x: Any, x_mask: Any, *args: Any, **kwargs: Any) -> Any:
        if crop.start and x_mask.shape[-1] != x.shape[-1]:
            x_mask = x_mask[..., crop.start :]
        return wavenet(x, x_mask, *args, **kwargs)

    def conv2_forward(x: Any) -> Any:  # the estimate, [B, 80, T - start]: zeros before the crop
        out = conv2(x)
        return torch.nn.functional.pad(out, (crop.start, 0)) if crop.start else out

    for owner, name, value in (
        (cfm, "solve_euler", solve_euler),
        (estimator.skip_linear, "forward", skip_linear),
        (estimator.wavenet, "forward", wavenet_forward),
        (estimator.conv2, "forward", conv2_forward),
    ):
        installed.attributes.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, value)
    return None


def _weight_norm_once(estimator: Any, installed: _Installed) -> Union[str, None]:
    torch = _torch()
    # torch.nn.utils.weight_norm's layers keep ``<name>_g`` and ``<name>_v`` beside ``<name>``.
    found = [m for m in estimator.modules() if hasattr(m, "weight_g") and hasattr(m, "weight_v")]
    if not found:
        return "its DiT has no weight-norm hooks"
    with torch.no_grad():
        for module in found:
            g, v = module.weight_g, module.weight_v
            # the dim it was laid over: where ``g`` is not 1 wide (None: over the whole weight)
            dim = None if g.dim() == 0 else next((i for i, size in enumerate(g.shape) if size != 1), 0)
            torch.nn.utils.remove_weight_norm(module)  # the weight as the hook computes it, once
            installed.norms.append((module, g, v, dim))
    return None


def _restore_weight_norm(module: Any, g: Any, v: Any, dim: Any) -> None:
    """``module``'s weight norm back, with its own ``g`` and ``v`` (the same weight, bit for bit)."""
    torch = _torch()
    with torch.no_grad():
        del module.weight
        module.weight = torch.nn.Parameter(v.detach().clone())
        torch.nn.utils.weight_norm(module, dim=dim)
        module.weight_g.copy_(g)
        module.weight_v.copy_(v)
