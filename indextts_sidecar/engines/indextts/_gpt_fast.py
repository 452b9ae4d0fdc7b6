"""The GPT's same-output speed-ups (issue 42, point 1; docs/indextts.md, "The same output, faster").

At full size on a CPU a decoding step of upstream's GPT (three beams) took about twice its
memory floor. Its time went to two places this module takes out, on the loaded instance only
(upstream's files and classes stay untouched, as :mod:`._prefix` does):

**Packed linear layers** (``packed_linear``). GPT-2's ``Conv1D`` multiplies ``x @ W`` with ``W``
stored ``[in, out]``, through MKL's general product. With two or three rows (a lone request's
beams) MKL picks a kernel that runs 1.4-1.5x slower than the weights' read; with one row it
reads at the floor. oneDNN's linear over the same weights, reordered once into its blocked
layout, is as fast at one row and reaches the floor at three: every ``Conv1D`` of the GPT-2
stack gets that layout, and its forward calls oneDNN.  So does the vocabulary head
(``mel_head``, an ``nn.Linear`` of 1280 x 8194 at full size, which every step runs after the
stack): on an AMD EPYC without AVX-512 MKL took about 9 ms a step for it at three rows.  The
weights are replaced, not doubled (the memory stays as it was). Where it applies: a CPU with
oneDNN, float32 weights and no autocast (upstream's ``dtype`` None), or bfloat16 weights under
upstream's bfloat16 autocast (``bf16_weights``, the fast profile's): there oneDNN's bf16
products (AMX or AVX512-BF16) read half the bytes, where autocast's own bf16 ``addmm`` ran
slower than float32. Not for fp16 or on a GPU.

**A beam cache** (``beam_cache``). Hugging Face's ``DynamicCache`` concatenates every layer's
keys and values into a new tensor at each step, and beam search then gathers every row of every
layer into another (``reorder_cache``): two copies of the whole cache a step. The cache given
to ``generate`` here keeps each layer in a buffer with room to grow (a step writes its one
position in place) and moves only the rows whose beam changed. What attention reads is the
same numbers, in the same order.

Neither changes what is computed, only how: oneDNN adds the products in another order than MKL,
so logits differ in their last bits (about 1e-7 relative), as a batch's do. Greedy tokens stay
the same and audio within one int16 step (tests/upstream/test_gpt_fast.py on the tiny fixtures;
``bench/bench_gpt_step.py`` at full size).
"""

from __future__ import annotations

import functools
import importlib
import sys
import weakref
from collections.abc import Sequence
from typing import Any, Union

__all__ = ["PARTS", "install", "uninstall"]

#: The speed-ups, by name: what ``install`` reports on.
PARTS = ("packed_linear", "beam_cache")

#: The rows oneDNN's weight layout is chosen for: upstream's three beams.  One layout serves
#: every row count (measured 1 to 300: docs/indextts.md).
_LAYOUT_ROWS = 3
#: A beam cache's buffer, when full, is laid anew with room for half as many positions again as it
#: holds (at least this many): a copy of the whole now and then, against one a step before, and at
#: most a third of the buffer unused.
_GROW_MIN = 32
#: What :func:`install` replaced on each GPT's inference model (its instance attributes before,
#: None where it had none), and the weights it kept beside each packed layer (``keep_weights``).
_REPLACED: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_KEPT: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def install(model: Any, *, parts: Sequence[str] = PARTS, keep_weights: bool = False) -> dict[str, str]:
    """Put the speed-ups named in ``parts`` on ``model``: each part's name, and ``on``, ``off`` (not
    in ``parts``) or why it is not on.

    ``keep_weights`` keeps the original weights beside the packed ones, so that
    :func:`uninstall` can restore upstream's path (the benchmark interleaves both).
    """
    gpt = getattr(model, "gpt", None)
    report = dict.fromkeys(PARTS, "off")
    if "packed_linear" in parts:
        report["packed_linear"] = _pack(model, gpt, keep_weights) or "on"
    if "beam_cache" in parts:
        report["beam_cache"] = _cache(gpt) or "on"
    return report


def uninstall(model: Any) -> None:
    """Upstream's path again (only where :func:`install` kept the weights)."""
    gpt = getattr(model, "gpt", None)
    inference = getattr(gpt, "inference_model", None)
    replaced = _REPLACED.pop(inference, None) if inference is not None else None
    if replaced is not None:
        for name, before in replaced.items():
            if before is None:
                vars(inference).pop(name, None)
            else:
                setattr(inference, name, before)
    for module in _packable(gpt):
        kept = _KEPT.pop(module, None)
        if kept is not None:
            module.weight = kept
            del module.forward


def _torch() -> Any:
    return importlib.import_module("torch")


def _conv1ds(stack: Any) -> list[Any]:
    """The GPT-2 stack's ``Conv1D`` layers (transformers' ``[in, out]`` linear)."""
    modules = getattr(stack, "modules", None)
    if not callable(modules):
        return []
    return [m for m in modules() if type(m).__name__ == "Conv1D" and hasattr(m, "nf") and hasattr(m, "bias")]


def _head(gpt: Any) -> list[Any]:
    """The GPT's vocabulary head (``mel_head``, ``nn.Linear``: ``[out, in]``), where it has one
    with a bias.  Each decoding step multiplies its beams' rows by it, as the stack's layers."""
    head = getattr(gpt, "mel_head", None)
    if type(head).__name__ == "Linear" and getattr(head, "bias", None) is not None:
        return [head]
    return []


def _packable(gpt: Any) -> list[Any]:
    """What ``packed_linear`` lays out: the stack's ``Conv1D`` layers, then the head."""
    layers = _conv1ds(getattr(gpt, "gpt", None))
    return [*layers, *_head(gpt)] if layers else []


def _pack(model: Any, gpt: Any, keep_weights: bool) -> Union[str, None]:
    layers = _packable(gpt)
    if not layers:
        return "its GPT has no GPT-2 Conv1D layers"
    torch = _torch()
    dtype = getattr(model, "dtype", None)
    if dtype is not None and dtype != torch.bfloat16:
        return f"the GPT runs under autocast ({dtype})"
    wanted = torch.float32 if dtype is None else torch.bfloat16  # bf16_weights: bf16 weights, bf16 autocast
    reorder = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled) or reorder is None:
        return "this torch has no oneDNN linear"
    for module in layers:
        weight = module.weight
        if weight is None:
            return None  # packed already
        if weight.device.type != "cpu" or weight.dtype != wanted or module.bias is None:
            return f"its GPT's weights are {weight.dtype} on {weight.device.type}, not {wanted} on a CPU"
        if module.bias.dtype != wanted:
            return f"its GPT's biases are {module.bias.dtype}, not {wanted}"
    forward = _packed_forward if wanted == torch.float32 else _packed_bf16_forward
    for module in layers:
        weight = module.weight
        # oneDNN takes the weight as [out, in]: nn.Linear's layout, Conv1D's transposed.
        plain = weight.detach() if type(module).__name__ == "Linear" else weight.detach().t()
        with torch.no_grad():
            packed = reorder(plain.contiguous(), _LAYOUT_ROWS)
        if keep_weights:
            _KEPT[module] = weight
        module.weight = None  # the packed layout replaces it: the memory stays as it was
        module.forward = functools.partial(forward, torch.ops.mkldnn._linear_pointwise, packed, module.bias)
    return None


def _packed_forward(linear: Any, packed: Any, bias: Any, x: Any) -> Any:
    """``Conv1D.forward`` (or the head's ``Linear.forward``) over oneDNN's layout: ``x @ W + b``
    for any leading shape."""
    return linear(x, packed, bias, "none", [], "")


def _packed_bf16_forward(linear: Any, packed: Any, bias: Any, x: Any) -> Any:
    """The same over bfloat16 weights: the input cast to bfloat16 first, as autocast's ``addmm`` does."""
    return linear(x.to(packed.dtype), packed, bias, "none", [], "")


def _cache(gpt: Any) -> Union[str, None]:
    inference: Any = getattr(gpt, "inference_model", None)
    generate = getattr(inference, "generate", None)
    if not callable(generate):
        return "its GPT has no generate"
    if not getattr(inference, "kv_cache", True):
        return "its GPT decodes without a key-value cache"
    if "torch" not in sys.modules:
        return "torch is not loaded"
    try:
        utils = importlib.import_module("transformers.cache_utils")
    except ImportError:
        return "transformers has no cache_utils"
    dynamic = getattr(utils, "DynamicCache", None)
    probe = dynamic() if dynamic is not None else None
    if probe is None or not isinstance(getattr(probe, "key_cache", None), list) or hasattr(probe, "layers"):
        return "its transformers' DynamicCache is not the key_cache/value_cache one this cache extends"
    if inference in _REPLACED:
        return None
    names = ("generate", "forward", "_supports_cache_class")
    _REPLACED[inference] = {name: vars(inference).get(name) for name in names}
    cache_class = _beam_cache_class(dynamic)

    @functools.wraps(generate)
    def with_beam_cache(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("past_key_values") is None and kwargs.get("use_cache", True) is not False:
            kwargs["past_key_values"] = cache_class()
        return generate(*args, **kwargs)

    forward = inference.forward

    @functools.wraps(forward)  # generate reads the forward's signature
    def in_cache_order(*args: Any, **kwargs: Any) -> Any:
        rows = getattr(kwargs.get("past_key_values"), "rows", None)
        if rows is None or args:
            return forward(*args, **kwargs)
        return _in_cache_order(forward, rows, kwargs)

    problem = _strided_attention()
    if problem is not None:
        return problem
    inference.generate = with_beam_cache
    inference.forward = in_cache_order
    # Upstream's GPT2InferenceModel says it takes no Cache (its generate then hands the model a tuple
    # that transformers turns into a DynamicCache and back at every step); its GPT-2 does take one.
    inference._supports_cache_class = True
    return None


#: The attribute that marks a beam cache's keys and values (views of its buffers) for ``_strided_attention``.
_MARK = "_indextts_sidecar_in_place"


def _marked(view: Any) -> Any:
    setattr(view, _MARK, True)
    return view


def _strided_attention() -> Union[str, None]:
    """GPT-2's ``sdpa`` attention, without the copy of a beam cache's keys and values.

    transformers' ``sdpa_attention_forward`` makes its keys and values contiguous (a guard for a
    CUDA kernel's bug with strided inputs); a beam cache's are views of buffers with room to grow,
    so that guard would copy every layer's whole cache at every step, what ``DynamicCache``'s
    concatenation did.  torch's CPU attention reads strided keys and values as they are (the same
    numbers: checked bit for bit by tests/upstream/test_gpt_fast.py).  transformers' own way to
    override an attention function for one model family is another ``AttentionInterface`` in its
    modeling module: GPT-2's gets one whose ``sdpa`` passes a beam cache's keys and values on CPU
    straight to torch, and everything else to transformers' function unchanged.  Once per process:
    it changes nothing for tensors no beam cache made."""
    try:
        gpt2: Any = importlib.import_module("transformers.models.gpt2.modeling_gpt2")
    except ImportError:
        return "transformers has no GPT-2 module"
    interface: Any = getattr(gpt2, "ALL_ATTENTION_FUNCTIONS", None)
    original = interface["sdpa"] if interface is not None and hasattr(interface, "_global_mapping") else None
    if original is None:
        return "its transformers' GPT-2 has no attention interface"
    if getattr(original, _MARK, False):
        return None
    torch = _torch()

    def sdpa(
        module: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        dropout: float = 0.0,
        scaling: Any = None,
        is_causal: Any = None,
        **kwargs: Any,
    ) -> Any:
        if not getattr(key, _MARK, False) or key.device.type != "cpu" or hasattr(module, "num_key_value_groups"):
            return original(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
        if attention_mask is not None and attention_mask.ndim == 4:
            attention_mask = attention_mask[:, :, :, : key.shape[-2]]
        if is_causal is None:
            is_causal = query.shape[2] > 1 and attention_mask is None
        out = torch.nn.functional.scaled_dot_product_attention(
            query.contiguous(),
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            scale=scaling,
            is_causal=is_causal,
        )
        return out.transpose(1, 2).contiguous(), None

    setattr(sdpa, _MARK, True)
    ours = type(interface)()
    ours["sdpa"] = sdpa
    gpt2.ALL_ATTENTION_FUNCTIONS = ours
    return None


def _in_cache_order(forward: Any, rows: list[int], kwargs: dict[str, Any]) -> Any:
    """A decoding step with its rows where the cache keeps them: row ``rows[i]`` of the cache
    holds beam ``i``'s past, so beam ``i``'s input goes to row ``rows[i]`` and its logits come back
    from there.  Each row is computed on its own (attention never mixes rows), so the order of
    the rows changes no row's numbers beyond the last bits of a matrix product."""
    torch = _torch()
    where = torch.tensor(rows, dtype=torch.long)
    which = torch.empty_like(where)
    which[where] = torch.arange(len(rows), dtype=torch.long)  # the beam of each cache row
    call = dict(kwargs)
    for name in ("input_ids", "attention_mask", "position_ids", "token_type_ids"):
        value = call.get(name)
        if value is not None:
            call[name] = value[which.to(value.device)]
    out = forward(**call)
    if isinstance(out, tuple):
        return (out[0][where.to(out[0].device)], *out[1:])
    out.logits = out.logits[where.to(out.logits.device)]
    return out


@functools.cache
def _beam_cache_class(dynamic: Any) -> Any:
    """A ``DynamicCache`` whose layers grow in place and whose beams move row by row."""
    return type("BeamCache", (_BeamCache, dynamic), {"__doc__": _BeamCache.__doc__})


class _BeamCache:
    """Each layer's keys and values: a view ``[:, :, :length]`` of a buffer with room to grow."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._buffers: list[Union[tuple[Any, Any], None]] = []
        #: The cache row holding each beam's past; None: row ``i`` holds beam ``i``'s.
        self.rows: Union[list[int], None] = None

    def update(self, key_states: Any, value_states: Any, layer_idx: int, cache_kwargs: Any = None) -> Any:
        if layer_idx == 0 and hasattr(self, "_seen_tokens"):
            self._seen_tokens += key_states.shape[-2]
        while len(self.key_cache) <= layer_idx:
            self.key_cache.append(key_states.new_empty(0))
            self.value_cache.append(value_states.new_empty(0))
        while len(self._buffers) <= layer_idx:
            self._buffers.append(None)
        held = self.key_cache[layer_idx]
        length = int(held.shape[-2]) if held.numel() else 0
        end = length + int(key_states.shape[-2])
        buffers = self._buffers[layer_idx]
        if buffers is None or not _fits(buffers[0], key_states, end) or not _fits(buffers[1], value_states, end):
            old = (self.key_cache[layer_idx], self.value_cache[layer_idx]) if length else None
            buffers = self._lay(layer_idx, key_states, value_states, end, old)
        keys, values = buffers
        keys[:, :, length:end].copy_(key_states)
        values[:, :, length:end].copy_(value_states)
        self.key_cache[layer_idx] = _marked(keys[:, :, :end])
        self.value_cache[layer_idx] = _marked(values[:, :, :end])
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def _lay(self, layer_idx: int, key: Any, value: Any, end: int, old: Any) -> tuple[Any, Any]:
        """New buffers for a layer, shaped as ``key``/``value`` with room for ``end`` positions and
        more; ``old`` (keys and values) copied to their start."""
        room = end + max(_GROW_MIN, end // 2)
        keys = key.new_empty((*key.shape[:2], room, key.shape[-1]))
        values = value.new_empty((*value.shape[:2], room, value.shape[-1]))
        if old is not None:
            keys[:, :, : old[0].shape[-2]].copy_(old[0])
            values[:, :, : old[1].shape[-2]].copy_(old[1])
        self._buffers[layer_idx] = (keys, values)
        return keys, values

    def reorder_cache(self, beam_idx: Any) -> None:
        """Beam ``i`` now continues beam ``beam_idx[i]``'s past.  Nothing moves but a past that
        two beams continue: the first keeps its row, the other gets a copy in a row that no
        beam continues any more.  Which row holds which beam is :attr:`rows`, and a decoding
        step sends each beam's input to its row (``_in_cache_order``)."""
        order = beam_idx.tolist()
        current = self.rows or list(range(len(order)))
        rows: list[int] = [-1] * len(order)
        taken: set[int] = set()
        shared: list[tuple[int, int]] = []
        for beam, source in enumerate(order):
            row = current[source]
            if row in taken:
                shared.append((beam, row))
            else:
                rows[beam] = row
                taken.add(row)
        free = [row for row in range(len(order)) if row not in taken]
        for (beam, row), spare in zip(shared, free, strict=False):
            rows[beam] = spare
            self._copy_row(row, spare)
        self.rows = None if rows == list(range(len(order))) else rows

    def _copy_row(self, source: int, target: int) -> None:
        for layer_idx, buffers in enumerate(self._buffers):
            if buffers is None or not self.key_cache[layer_idx].numel():
                continue
            length = int(self.key_cache[layer_idx].shape[-2])
            for buffer in buffers:
                buffer[target, :, :length].copy_(buffer[source, :, :length])

    def _beams(self, tensor: Any) -> Any:
        """A layer's keys or values in beam order."""
        if self.rows is None or not tensor.numel():
            return tensor
        return tensor[tensor.new_tensor(self.rows, dtype=_torch().long)]

    def to_legacy_cache(self) -> Any:
        return tuple((self._beams(k), self._beams(v)) for k, v in zip(self.key_cache, self.value_cache, strict=True))

    def _replace(self, keys: list[Any], values: list[Any]) -> None:
        """Every layer replaced whole (the rows repeated or selected): laid into new buffers, in beam order."""
        self._buffers = [None] * len(keys)
        self.rows = None
        self.key_cache, self.value_cache = list(keys), list(values)
        for layer_idx, (key, value) in enumerate(zip(keys, values, strict=True)):
            if key.numel():
                end = int(key.shape[-2])
                laid_keys, laid_values = self._lay(layer_idx, key, value, end, (key, value))
                self.key_cache[layer_idx] = laid_keys[:, :, :end]
                self.value_cache[layer_idx] = laid_values[:, :, :end]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._replace(
            [self._beams(k).repeat_interleave(repeats, dim=0) for k in self.key_cache],
            [self._beams(v).repeat_interleave(repeats, dim=0) for v in self.value_cache],
        )

    def batch_select_indices(self, indices: Any) -> None:
        self._replace(
            [self._beams(k)[indices, ...] for k in self.key_cache],
            [self._beams(v)[indices, ...] for v in self.value_cache],
        )


def _fits(buffer: Any, states: Any, end: int) -> bool:
    """Whether ``buffer`` can take ``states`` up to position ``end``: same rows, heads, width, kind."""
    return bool(
        end <= buffer.shape[-2]
        and buffer.shape[:2] == states.shape[:2]
        and buffer.shape[-1] == states.shape[-1]
        and buffer.dtype == states.dtype
        and buffer.device == states.device
    )
