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

**The last layer over the new frames only** (``last_layer_crop``, with ``tail_crop``). The
transformer's last block feeds nothing but the tail, so only its rows from the crop's start on
are used: there its queries, its attention's output projection and its feed-forward layer run
over those rows alone, while its keys and values still come from every frame (the attention
mixes them all). The rows before the start are zeros, which the tail crops off.

**No mask that masks nothing** (``mask_skip``). The DiT gives its attention a boolean mask of
every frame against every frame, built from the request's length: for one request it is all
true, and the attention still reads it (turned into an additive one) at every layer and step.
Where it is all true the attention runs without it, which attends to the same frames. On the
CPU only: the check reads the mask back, which on a GPU would wait for the device every step.

**Weight norm once** (``weight_norm_once``). The DiT's weight-normed layers (its WaveNet, its
input and final projections) recompute ``g * v / |v|`` at every forward, 40 times a step.
Here torch's ``remove_weight_norm`` computes it once into the weight: the same tensor as the
hook's, so the same output bit for bit.

None applies to a DiT compiled by ``use_torch_compile``: the report says so.

The products over fewer frames may add in another order (a different blocking), and attention
without its mask takes another kernel path, so the estimate can differ in its last bits: audio
within one int16 step, greedy codes untouched (the GPT runs before).
tests/upstream/test_gpt_fast.py checks them on the tiny fixtures against upstream's path;
``bench/bench_gpt_step.py`` times them at full size.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = ["PARTS", "install", "uninstall"]

#: The speed-ups, by name: what ``install`` reports on.
PARTS = ("tail_crop", "last_layer_crop", "mask_skip", "weight_norm_once")


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
    #: Whether the attention mask of the transformer's call in progress masks nothing.
    unmasked: bool = False


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
    crop = _Crop(margin=0)
    if "tail_crop" in parts:
        report["tail_crop"] = _crop(cfm, installed, crop) or "on"
    if "last_layer_crop" in parts:
        if report["tail_crop"] != "on":
            report["last_layer_crop"] = "it needs tail_crop"
        else:
            report["last_layer_crop"] = _last_layer(cfm.estimator, installed, crop) or "on"
    if "mask_skip" in parts:
        report["mask_skip"] = _mask_skip(cfm.estimator, installed, crop) or "on"
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


def _crop(cfm: Any, installed: _Installed, crop: _Crop) -> Union[str, None]:
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
    crop.margin = sum(reach or 0 for reach in reaches)
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

    _put(
        installed,
        (cfm, "solve_euler", solve_euler),
        (estimator.skip_linear, "forward", skip_linear),
        (estimator.wavenet, "forward", wavenet_forward),
        (estimator.conv2, "forward", conv2_forward),
    )
    return None


def _put(installed: _Installed, *wrappers: tuple[Any, str, Any]) -> None:
    """Set each (owner, name, value) on its instance, keeping what was there to take it off again."""
    for owner, name, value in wrappers:
        installed.attributes.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, value)


def _blocks(estimator: Any) -> Union[list[Any], None]:
    """The DiT's transformer blocks, where each is upstream's self-attention block (no
    cross-attention, no KV cache, no time token, the projections this module reads)."""
    layers = getattr(getattr(estimator, "transformer", None), "layers", None)
    if not layers:
        return None
    for block in layers:
        attention = getattr(block, "attention", None)
        if (
            getattr(block, "has_cross_attention", False)
            or getattr(block, "time_as_token", True)
            or getattr(attention, "kv_cache", None) is not None
            or not all(hasattr(attention, name) for name in ("wqkv", "wo", "n_head", "n_local_heads", "head_dim"))
            or not all(hasattr(block, name) for name in ("attention_norm", "ffn_norm", "feed_forward"))
        ):
            return None
    return list(layers)


def _mask_skip(estimator: Any, installed: _Installed, crop: _Crop) -> Union[str, None]:
    blocks = _blocks(estimator)
    if blocks is None:
        return "its DiT's transformer is not upstream's layout"
    device = next((p.device.type for p in estimator.parameters()), "cpu")
    if device != "cpu":  # reading the mask back would wait for the device at every step
        return f"measured on the CPU only; on {device} its check would wait for the device every step"
    transformer = estimator.transformer
    forward = transformer.forward
    signature = inspect.signature(forward)

    @functools.wraps(forward)
    def transformer_forward(*args: Any, **kwargs: Any) -> Any:
        mask = signature.bind(*args, **kwargs).arguments.get("mask")
        crop.unmasked = mask is not None and bool(mask.all())
        try:
            return forward(*args, **kwargs)
        finally:
            crop.unmasked = False

    def unmasked(attend: Any) -> Any:
        @functools.wraps(attend)
        def attention_forward(x: Any, freqs_cis: Any, mask: Any, *args: Any, **kwargs: Any) -> Any:
            return attend(x, freqs_cis, None if crop.unmasked else mask, *args, **kwargs)

        return attention_forward

    _put(
        installed,
        (transformer, "forward", transformer_forward),
        *((block.attention, "forward", unmasked(block.attention.forward)) for block in blocks),
    )
    return None


def _last_layer(estimator: Any, installed: _Installed, crop: _Crop) -> Union[str, None]:
    blocks = _blocks(estimator)
    if blocks is None:
        return "its DiT's transformer is not upstream's layout"
    block = blocks[-1]
    # the functions upstream's attention calls, from its own module
    module = sys.modules.get(type(block.attention).__module__)
    rotary, functional = getattr(module, "apply_rotary_emb", None), getattr(module, "F", None)
    if rotary is None or not callable(getattr(functional, "scaled_dot_product_attention", None)):
        return "its DiT's attention module has no apply_rotary_emb or F beside it"
    forward = block.forward
    signature = inspect.signature(forward)
    torch = _torch()

    @functools.wraps(forward)
    def block_forward(*args: Any, **kwargs: Any) -> Any:
        start = crop.start
        if not start:
            return forward(*args, **kwargs)
        bound = signature.bind(*args, **kwargs).arguments
        x, c, skip = bound["x"], bound["c"], bound.get("skip_in_x")
        if getattr(block, "uvit_skip_connection", False) and skip is not None:
            x = block.skip_in_linear(torch.cat([x, skip], dim=-1))
        # upstream's block, its rows from ``start`` on: the attention's keys and values over all
        h = x[:, start:] + _attend_from(block.attention, (rotary, functional), block.attention_norm(x, c), bound, crop)
        out = h + block.feed_forward(block.ffn_norm(h, c))
        return torch.nn.functional.pad(out, (0, 0, start, 0))

    _put(installed, (block, "forward", block_forward))
    return None


def _attend_from(attention: Any, calls: tuple[Any, Any], x: Any, bound: dict[str, Any], crop: _Crop) -> Any:
    """Upstream's ``Attention.forward`` over ``x``, for the queries of the rows from the crop's
    start on only (without the mask where ``mask_skip`` found it masks nothing).  ``calls``: the
    rotary embedding and ``F`` of the attention's module."""
    rotary, functional = calls
    start, freqs_cis = crop.start, bound["freqs_cis"]
    mask = None if crop.unmasked else bound["mask"]
    bsz, seqlen, _ = x.shape
    heads, local, width = attention.n_head, attention.n_local_heads, attention.head_dim
    q, k, v = attention.wqkv(x).split([local * width] * 3, dim=-1)
    q = rotary(q[:, start:].reshape(bsz, seqlen - start, heads, width), freqs_cis[start:])
    k = rotary(k.reshape(bsz, seqlen, local, width), freqs_cis)
    v = v.reshape(bsz, seqlen, local, width)
    q, k, v = (part.transpose(1, 2) for part in (q, k, v))
    if heads != local:
        k, v = k.repeat_interleave(heads // local, dim=1), v.repeat_interleave(heads // local, dim=1)
    if mask is not None and mask.shape[-2] == seqlen:
        mask = mask[..., start:, :]
    y = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
    return attention.wo(y.transpose(1, 2).contiguous().view(bsz, seqlen - start, width * heads))


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
