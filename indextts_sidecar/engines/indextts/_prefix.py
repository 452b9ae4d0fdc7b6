"""The voice prefix cache: a voice's conditioning and the GPT's keys and values over it, reused.

For every segment of every request, upstream's GPT (``model_v2.UnifiedVoice``) recomputes what
depends on the voice alone:

``gpt.merge_emovec(...)``
    the emotion vector (two conformer encoders over the speaker's and the emotion clip's
    features), called by ``infer_generator`` before each GPT call;
``gpt.get_conditioning(...)``
    IndexTTS-2's speaker latents (a conformer and a perceiver over the speaker's features),
    inside ``inference_speech`` (2.5 projects its CAMPPlus embedding instead: one linear layer);
the first forward pass of ``generate``
    over the prompt ``[conditioning][text][start]``: the conditioning part (``conds_latent``: 34
    positions for 2, 3 for 2.5) is the same for every request of the voice.

:func:`install` puts a wrapper in front of each of these on the loaded instance (attributes of
the one instance, as :mod:`._batched` does; upstream's files and classes stay untouched), plus
``gpt.prepare_gpt_inputs`` (to see the conditioning rows it lays out), ``gpt.inference_speech``
(to time the prefill) and ``gpt.inference_model.forward`` (the GPT's forward pass):

- the emotion vector and the speaker latents are kept under a key of the exact bytes of their
  inputs (and the autocast state), so a request whose inputs differ in any way computes afresh;
- on the first forward pass of a ``generate``, each row's conditioning (read back from the
  prompt upstream laid out, checked bitwise against the latents it was given) is looked up by
  its bytes; when every row's keys and values are kept, the pass runs over the positions after
  the conditioning only, the kept keys and values as its past (the rows of a batch padded on
  the left keep upstream's layout: their padding is masked, its keys and values are zeros); when
  any is missing, the pass runs as upstream's and the missing rows' keys and values are kept.

GPT-2 here has no position embeddings of its own (upstream replaces ``wpe`` with zeros) and its
attention is causal, so the conditioning's keys and values do not depend on the text after it.
The cached items live in a :class:`._prefix_store.PrefixStore`, bounded in entries and bytes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Union

from ._prefix_store import PrefixStore

__all__ = ["install"]

_local = threading.local()


def install(model: Any, store: PrefixStore) -> Union[str, None]:
    """Put the cache's wrappers on ``model``; why it cannot (an unknown GPT), or None."""
    gpt: Any = getattr(model, "gpt", None)
    inference: Any = getattr(gpt, "inference_model", None)
    missing = [
        name
        for owner, name in ((gpt, "inference_speech"), (gpt, "prepare_gpt_inputs"), (inference, "forward"))
        if not callable(getattr(owner, name, None))
    ]
    if missing or not hasattr(inference, "cached_mel_emb"):
        return f"its GPT has no {', '.join(missing) or 'cached_mel_emb'}"
    if getattr(gpt, "_indextts_sidecar_prefix", None) is not None:
        return None
    wrappers = _Wrappers(gpt, inference, store)
    gpt.inference_speech = _wrap(wrappers.speech_original, wrappers.inference_speech)
    gpt.prepare_gpt_inputs = _wrap(wrappers.prepare_original, wrappers.prepare_gpt_inputs)
    inference.forward = _wrap(wrappers.forward_original, wrappers.forward)
    if callable(wrappers.merge_original):
        gpt.merge_emovec = _wrap(wrappers.merge_original, wrappers.merge_emovec)
    if callable(wrappers.conditioning_original):
        gpt.get_conditioning = _wrap(wrappers.conditioning_original, wrappers.get_conditioning)
    gpt._indextts_sidecar_prefix = wrappers
    return None


def _wrap(original: Callable[..., Any], method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` as a function that wears ``original``'s name and signature: generate() reads
    the forward's signature (its model keywords), and :mod:`._batched` binds the GPT call's."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    return functools.wraps(original)(wrapper)


class _Wrappers:
    """What :func:`install` puts in front of upstream's calls on one GPT (the module says why)."""

    def __init__(self, gpt: Any, inference: Any, store: PrefixStore) -> None:
        self.inference = inference
        self.store = store
        self.speech_original: Callable[..., Any] = gpt.inference_speech
        self.prepare_original: Callable[..., Any] = gpt.prepare_gpt_inputs
        self.forward_original: Callable[..., Any] = inference.forward
        self.merge_original: Union[Callable[..., Any], None] = getattr(gpt, "merge_emovec", None)
        self.conditioning_original: Union[Callable[..., Any], None] = getattr(gpt, "get_conditioning", None)
        #: The class of the keys and values the model answers with, when not a tuple (a Cache).
        self.past_type: Any = None

    def inference_speech(self, *args: Any, **kwargs: Any) -> Any:
        _local.started = time.perf_counter()
        _local.conds = None
        try:
            return self.speech_original(*args, **kwargs)
        finally:
            _local.started = None
            _local.conds = None

    def prepare_gpt_inputs(self, conditional_latents: Any, *args: Any, **kwargs: Any) -> Any:
        out = self.prepare_original(conditional_latents, *args, **kwargs)
        _local.conds = conditional_latents  # for the forward pass that comes next
        return out

    def merge_emovec(self, speaker: Any, emotion: Any, *args: Any, **kwargs: Any) -> Any:
        assert self.merge_original is not None
        started = time.perf_counter()
        try:
            if not self.store.enabled:
                return self.merge_original(speaker, emotion, *args, **kwargs)
            torch = _torch()
            key: tuple[Hashable, ...] = (_digest(torch, speaker), _digest(torch, emotion))
            key += (_plain(torch, (args, kwargs)), _amp(torch, speaker))
            held = self.store.get("emotion", key)
            if held is None:
                held = self.merge_original(speaker, emotion, *args, **kwargs)
                self.store.put("emotion", key, held, _size(held))
            return held.clone()
        finally:
            self.store.tally.prefill += time.perf_counter() - started

    def get_conditioning(self, inputs: Any, lengths: Any = None, *args: Any, **kwargs: Any) -> Any:
        original = self.conditioning_original
        assert original is not None
        rows = int(inputs.size(0))
        per_row = lengths is None or (lengths.dim() == 1 and int(lengths.numel()) == rows)
        if not self.store.enabled or args or kwargs or not per_row:
            return original(inputs, lengths, *args, **kwargs)
        torch = _torch()
        out = []
        for row in range(rows):
            # Row by row, as a lone request computes it: a kept latent is the one it would get.
            one, length = inputs[row : row + 1], None if lengths is None else lengths[row : row + 1]
            key = (_digest(torch, one), _plain(torch, length), _amp(torch, inputs))
            held = self.store.get("conditioning", key)
            if held is None:
                held = original(one, length)
                self.store.put("conditioning", key, held, _size(held))
            out.append(held)
        return out[0].clone() if rows == 1 else torch.cat(out, dim=0)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        conds, _local.conds = getattr(_local, "conds", None), None
        if conds is None or args:
            return self.forward_original(*args, **kwargs)  # a decoding step, or not upstream's generate
        torch = _torch()
        plan = _plan(torch, self.inference.cached_mel_emb, conds, kwargs) if self.store.enabled else None
        if plan is None:
            out = self.forward_original(**kwargs)
        else:
            kept = [self.store.get("kv", key) for key in plan.keys]
            if all(layers is not None for layers in kept):
                out = self._warm(torch, plan, kept, kwargs)
            else:
                out = self.forward_original(**kwargs)
                self._keep(plan, kept, out)
        self._timed(torch, conds)
        return out

    def _warm(self, torch: Any, plan: _Plan, kept: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """The first forward pass over the positions after the conditioning, its past the kept keys and values.

        ``generate`` hands the pass each row once per beam, all alike: it runs over one of each
        (``beams`` times less work) and its answer is repeated for the beams, as upstream's is.
        """
        width, mask = plan.width, kwargs.get("attention_mask")
        beams = plan.beams if _alike(torch, kwargs, plan.beams) else 1
        layers = []
        for index in range(len(kept[0])):
            pair = []
            for part in (0, 1):
                rows = [_shifted(torch, kept[row][index][part], pad, width) for row, pad in enumerate(plan.pads)]
                pair.append(torch.cat(rows, dim=0).repeat_interleave(plan.beams // beams, dim=0))
            layers.append(tuple(pair))
        past = kwargs.get("past_key_values")
        if past is None and self.past_type is not None:
            past = self.past_type()  # the Cache class the model answered with (transformers 5's)
        if past is None:
            past = tuple(layers)  # transformers 4: a tuple of pairs, as the model answers
        else:  # an empty Cache object
            for index, (keys, values) in enumerate(layers):
                past.update(keys, values, index)
        call = dict(kwargs, past_key_values=past, input_ids=kwargs["input_ids"][::beams, width:])
        if mask is not None:
            call["attention_mask"] = mask[::beams]
        for name in ("position_ids", "token_type_ids"):
            if call.get(name) is not None:
                call[name] = call[name][::beams, width:]
        whole = self.inference.cached_mel_emb
        self.inference.cached_mel_emb = whole[:, width:]
        try:
            out = self.forward_original(**call)
        finally:
            self.inference.cached_mel_emb = whole
        return out if beams == 1 else _repeated(out, beams)

    def _keep(self, plan: _Plan, kept: Sequence[Any], out: Any) -> None:
        """Keep the conditioning's keys and values of each row whose were missing (one row each)."""
        answered = getattr(out, "past_key_values", None)
        layers = _layers(answered)
        if layers is None:
            return
        self.past_type = None if isinstance(answered, (tuple, list)) else type(answered)
        width = plan.width
        for row, (key, pad) in enumerate(zip(plan.keys, plan.pads, strict=True)):
            if kept[row] is not None or (pad and len(plan.keys) > 1):
                continue  # of a batch, only the rows laid out as alone (unpadded) are kept
            first, end = row * plan.beams, pad + width
            held = tuple(
                tuple(part[first : first + 1, :, pad:end].clone() for part in (keys, values)) for keys, values in layers
            )
            self.store.put("kv", key, held, sum(_size(part) for pair in held for part in pair))

    def _timed(self, torch: Any, conds: Any) -> None:
        started = getattr(_local, "started", None)
        if started is None:
            return
        if conds.device.type == "cuda":
            torch.cuda.synchronize(conds.device)
        self.store.tally.prefill += time.perf_counter() - started
        _local.started = None


class _Plan:
    """One first forward pass: each row's key and left padding, the conditioning's width, the beams."""

    def __init__(self, keys: list[Hashable], pads: list[int], width: int, beams: int) -> None:
        self.keys = keys
        self.pads = pads
        self.width = width
        self.beams = beams


def _plan(torch: Any, emb: Any, conds: Any, kwargs: dict[str, Any]) -> Union[_Plan, None]:
    """How the prompt ``emb`` holds ``conds`` row by row; None where it is not upstream's layout."""
    input_ids, mask, past = kwargs.get("input_ids"), kwargs.get("attention_mask"), kwargs.get("past_key_values")
    if input_ids is None or emb is None or not _empty(past) or conds.dim() != 3:
        return None
    batch, length = int(emb.size(0)), int(emb.size(1))
    rows, width = int(input_ids.size(0)), int(conds.size(1))
    if rows % batch or int(conds.size(0)) not in (1, batch) or int(input_ids.size(1)) != length + 1:
        return None
    beams = rows // batch
    keys: list[Hashable] = []
    pads: list[int] = []
    for row in range(batch):
        pad = 0 if mask is None else int((mask[row * beams].cumsum(0) == 0).sum())  # no mask: no padding
        cond = conds[row if int(conds.size(0)) == batch else 0]
        if pad + width + 1 >= length or not torch.equal(emb[row, pad : pad + width], cond):
            return None
        keys.append((_digest(torch, cond), _amp(torch, cond)))
        pads.append(pad)
    return _Plan(keys, pads, width, beams)


def _alike(torch: Any, kwargs: dict[str, Any], beams: int) -> bool:
    """Whether the pass's rows come ``beams`` alike (``generate``'s expansion), and its answer
    can be repeated: a model output with logits, its keys and values a tuple or a Cache."""
    if beams == 1:
        return False
    for name in ("input_ids", "attention_mask", "position_ids", "token_type_ids"):
        value = kwargs.get(name)
        if value is not None and not torch.equal(value, value[::beams].repeat_interleave(beams, dim=0)):
            return False
    return kwargs.get("return_dict") is not False


def _repeated(out: Any, beams: int) -> Any:
    """A forward pass's answer over one row of each beam group, repeated for the beams."""
    out.logits = out.logits.repeat_interleave(beams, dim=0)
    past = out.past_key_values
    if isinstance(past, (tuple, list)):
        out.past_key_values = tuple(tuple(t.repeat_interleave(beams, dim=0) for t in layer) for layer in past)
    elif past is not None:
        past.batch_repeat_interleave(beams)  # a Cache, in place
    return out


def _shifted(torch: Any, part: Any, pad: int, width: int) -> Any:
    """One row's kept keys (or values) placed after ``pad`` masked positions, cut to ``width``."""
    if not pad:
        return part
    zeros = part.new_zeros((*part.shape[:2], min(pad, width), part.shape[3]))
    return zeros if pad >= width else torch.cat([zeros, part[:, :, : width - pad]], dim=2)


def _layers(past: Any) -> Union[list[tuple[Any, Any]], None]:
    """A forward pass's keys and values per layer: a tuple of pairs, or a Cache of either API."""
    if isinstance(past, (tuple, list)):
        return [(layer[0], layer[1]) for layer in past]
    if hasattr(past, "layers"):  # transformers 5
        return [(layer.keys, layer.values) for layer in past.layers]
    if hasattr(past, "key_cache"):  # transformers 4's DynamicCache
        return list(zip(past.key_cache, past.value_cache, strict=True))
    return None


def _empty(past: Any) -> bool:
    if past is None:
        return True
    if isinstance(past, (tuple, list)):
        return not past
    length = getattr(past, "get_seq_length", None)
    return callable(length) and int(length()) == 0


def _torch() -> Any:
    """torch, already imported by upstream when a model call is wrapped."""
    return importlib.import_module("torch")


def _digest(torch: Any, tensor: Any) -> tuple[str, str, tuple[int, ...], bytes]:
    """A tensor's dtype, device, shape and a hash of its bytes."""
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
    return (str(tensor.dtype), str(tensor.device), tuple(tensor.shape), hashlib.blake2b(data, digest_size=16).digest())


def _plain(torch: Any, value: Any) -> Hashable:
    """Arguments (tensors, numbers, containers) as a hashable key of their contents."""
    if isinstance(value, torch.Tensor):
        return _digest(torch, value)
    if isinstance(value, dict):
        return tuple(sorted((name, _plain(torch, item)) for name, item in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(torch, item) for item in value)
    return repr(value)


def _amp(torch: Any, tensor: Any) -> tuple[Any, ...]:
    """The calling thread's autocast state on ``tensor``'s device: it changes what a call computes."""
    device = tensor.device.type
    try:
        return (device, bool(torch.is_autocast_enabled(device)), str(torch.get_autocast_dtype(device)))
    except (TypeError, RuntimeError, AttributeError):
        return (device, False, None)


def _size(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())
