"""Upstream's three model calls, intercepted on the loaded instance: deterministic decoding and batches.

Upstream's generator calls, for each segment of a request,

``model.gpt.inference_speech(...)``
    the GPT's autoregressive decoding (Hugging Face ``generate``), with ``do_sample=True``
    written into the call: upstream pops a request's ``do_sample`` and passes True regardless;
``model.s2mel.models["cfm"].inference(...)``
    the flow-matching decoder: noise from torch's global generator, then upstream's Euler
    solver (``solve_euler``) with two classifier-free-guidance rows (the request's, and one
    without its conditions), written for one request: it stacks one time step per half,
    which the interceptor on its estimator (upstream's DiT) repeats for each row of a half;
``model.bigvgan(...)``
    the vocoder;

and, around them, ``model.gpt.merge_emovec`` (the voice's emotion vector, from two
conditioning encoders), ``model.gpt.get_conditioning`` (inside the GPT call) and
``model.gpt(...)`` (the latents of a decoded segment, one forward pass).

:func:`install` puts an interceptor in front of each, as an attribute of the one instance
(upstream's files and classes stay untouched).  An interceptor passes the call through
unchanged unless the calling thread runs a request with a :class:`Decoding` context:

- greedy decoding (``do_sample=False``, one beam unless the request asks for more) replaces
  what upstream wrote into the GPT call;
- a seed gives the request its own noise generator: each segment's CFM noise is the next
  draw from it, and upstream's solver runs on that noise;
- the fast profile's ``diffusion_steps`` and ``cfg_rate`` (``_profile.py``) replace the
  steps and guidance rate upstream writes into the CFM call; ``bf16_s2mel`` and
  ``bf16_vocoder`` run the CFM and the vocoder in bfloat16 (``_precision.py``; a batch's keys
  hold them);
- in a batch (:mod:`._lockstep`), the call is parked and the coordinator runs the parked calls
  of all requests as one: :func:`run_calls`.

What a batch may share: GPT rows with the same generation settings (and, for 2.5, the same
language), padded as upstream's own ``prepare_gpt_inputs`` expects; CFM rows of exactly the
same length (upstream's DiT and wavenet see padded frames, so padding would change a row's
audio); vocoder rows of the same length, likewise; latent passes whose tensors all have the
same shapes.  What depends on the voice alone is computed once per batch: the emotion vector
of each voice (the requests of a batch that use upstream's same cached conditioning tensors
get one result), and, in a batched GPT call, the conditioning encoder over each distinct
reference row.  (On a CPU these are what batching saves most: docs/indextts.md, "Batching".)
A batch that fails is retried row by row, so that one request's bad input fails that request
alone.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Union

from ._lockstep import Call, Lockstep
from ._precision import autocast_bf16, vocoder_bf16

__all__ = ["Decoding", "Hooks", "decoding", "install", "interceptable", "run_calls", "set_decoding"]

log = logging.getLogger("indextts_sidecar.engines.indextts")

#: Sampling keywords a greedy decode drops (Hugging Face warns when they come with do_sample=False).
_SAMPLING_KEYWORDS = ("temperature", "top_p", "top_k")
#: GPT arguments that hold one row per request and are padded on their last axis.
_PADDED = {"speech_condition": 0, "emo_speech_condition": 0}
#: GPT arguments that are not batched: every row of a batch must have the same value.  (2.5's
#: ``langs`` is batched: its GPT, ``model_v2``'s, embeds ``langs[i]`` for row i.)
_SHARED: tuple[str, ...] = ()


@dataclass
class Decoding:
    """How one request decodes: the thread that runs it carries this (see :func:`decoding`)."""

    #: Greedy search instead of upstream's forced sampling.
    greedy: bool = False
    #: Beams for a greedy search (None: one).
    num_beams: Union[int, None] = None
    #: The seed of this request's own noise generator (None: torch's global generator).
    seed: Union[int, None] = None
    #: The lockstep this request runs in, when batched.
    batch: Union[Lockstep, None] = None
    #: Whether the vocoder runs batched too.
    batch_vocoder: bool = True
    #: Shared by the requests of one batch: per-voice results computed once (see :func:`install`).
    memo: Union[dict[Any, Any], None] = field(default=None, repr=False)
    #: The s2mel CFM's diffusion steps and guidance rate in place of upstream's (None: upstream's):
    #: the fast profile's knobs (``_profile.py``).  A batch's CFM key holds the values in effect.
    diffusion_steps: Union[int, None] = None
    cfg_rate: Union[float, None] = None
    #: The CFM's solve and the vocoder in bfloat16 (the fast profile's ``bf16_s2mel``, ``bf16_vocoder``).
    bf16_s2mel: bool = False
    bf16_vocoder: bool = False
    _generator: Any = field(default=None, repr=False)

    def s2mel(self, n_timesteps: Any, inference_cfg_rate: Any) -> tuple[Any, Any]:
        """The CFM call's steps and guidance rate, this request's knobs in place of upstream's."""
        steps = n_timesteps if self.diffusion_steps is None else self.diffusion_steps
        rate = inference_cfg_rate if self.cfg_rate is None else self.cfg_rate
        return steps, rate

    def noise(self, torch: Any, shape: list[int], device: Any) -> Any:
        """This request's next noise draw (torch's global generator without a seed)."""
        if self.seed is None:
            return torch.randn(shape, device=device)
        if self._generator is None:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.seed)
        return torch.randn(shape, device=device, generator=self._generator)

    @property
    def intercepts(self) -> bool:
        return self.greedy or self.seed is not None or self.batch is not None


_local = threading.local()


def current() -> Union[Decoding, None]:
    return getattr(_local, "decoding", None)


def set_decoding(context: Union[Decoding, None]) -> None:
    """Set the calling thread's context for good (a batch's worker thread, which runs one request)."""
    _local.decoding = context


@contextmanager
def decoding(context: Union[Decoding, None]) -> Iterator[None]:
    """Run the calling thread's model calls under ``context`` (None: upstream's own behaviour)."""
    previous = current()
    _local.decoding = context
    try:
        yield
    finally:
        _local.decoding = previous


@dataclass
class Hooks:
    """The originals behind the interceptors on one model instance."""

    gpt: Any
    cfm: Any
    vocoder: Any
    gpt_original: Callable[..., Any]
    cfm_original: Callable[..., Any]
    vocoder_original: Callable[..., Any]
    gpt_signature: inspect.Signature
    stop_text_token: int
    #: The GPT's own forward (the latents of a decoded segment, one pass), and its signature.
    latent_original: Union[Callable[..., Any], None] = None
    latent_signature: Union[inspect.Signature, None] = None

    def uninstall(self) -> None:
        owners = ((self.gpt, "inference_speech"), (self.cfm, "inference"), (self.vocoder, "forward"))
        optional = ((self.gpt, "merge_emovec"), (self.gpt, "get_conditioning"), (self.gpt, "forward"))
        for owner, name in (*owners, *optional, (self.cfm.estimator, "forward")):
            owner.__dict__.pop(name, None)


def interceptable(model: Any) -> Union[str, None]:
    """Why ``model``'s calls cannot be intercepted (an unknown upstream), or None when they can."""
    gpt = getattr(model, "gpt", None)
    if not callable(getattr(gpt, "inference_speech", None)):
        return "its GPT has no inference_speech"
    models = getattr(getattr(model, "s2mel", None), "models", None)
    try:
        cfm = models["cfm"] if models is not None else None
    except (KeyError, TypeError):
        cfm = None
    if cfm is None or not callable(getattr(cfm, "solve_euler", None)) or not hasattr(cfm, "in_channels"):
        return "its s2mel has no CFM with solve_euler"
    if not callable(getattr(getattr(model, "bigvgan", None), "forward", None)):
        return "it has no bigvgan vocoder"
    if getattr(gpt, "accel_engine", None) is not None:
        return (
            "its GPT runs on the accel engine (use_accel), which decodes one sequence per call here; "
            "load without use_accel to batch"
        )
    return None


def install(model: Any) -> Hooks:
    """Put the interceptors on ``model`` (see :func:`interceptable` first); idempotent."""
    existing = getattr(model, "_indextts_sidecar_hooks", None)
    if existing is not None:
        return existing  # type: ignore[no-any-return]
    gpt, cfm, vocoder = model.gpt, model.s2mel.models["cfm"], model.bigvgan
    gpt_original = gpt.inference_speech
    hooks = Hooks(
        gpt,
        cfm,
        vocoder,
        gpt_original,
        cfm.inference,
        vocoder.forward,
        inspect.signature(gpt_original),
        int(getattr(gpt, "stop_text_token", 1)),
    )
    latent_original = getattr(gpt, "forward", None)
    if callable(latent_original):
        hooks.latent_original = latent_original
        hooks.latent_signature = inspect.signature(latent_original)
    interceptors = _Interceptors(hooks)
    gpt.inference_speech = interceptors.inference_speech
    if callable(latent_original):
        gpt.forward = interceptors.latents
    if callable(interceptors.merge_original):
        gpt.merge_emovec = interceptors.merge_emovec
    if callable(interceptors.conditioning_original):
        gpt.get_conditioning = interceptors.get_conditioning
    cfm.inference = interceptors.inference
    vocoder.forward = interceptors.forward
    cfm.estimator.forward = interceptors.estimate
    model._indextts_sidecar_hooks = hooks
    return hooks


class _Interceptors:
    """What :func:`install` puts in front of upstream's calls on one model instance.

    Each passes the call through unchanged unless the calling thread runs a request with a
    :class:`Decoding` context (the module's docstring says what each does then).
    """

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks
        gpt = hooks.gpt
        self.estimator_original = hooks.cfm.estimator.forward
        self.merge_original: Union[Callable[..., Any], None] = getattr(gpt, "merge_emovec", None)
        self.conditioning_original: Union[Callable[..., Any], None] = getattr(gpt, "get_conditioning", None)

    def inference_speech(self, *args: Any, **kwargs: Any) -> Any:
        context = current()
        if context is None or not context.intercepts:
            return self.hooks.gpt_original(*args, **kwargs)
        torch = _torch()

        bound = self.hooks.gpt_signature.bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        extra = arguments.pop(_var_keyword(self.hooks.gpt_signature), {})
        arguments.update(extra)
        if context.greedy:
            arguments["do_sample"] = False
            arguments["num_beams"] = context.num_beams or 1
            for name in _SAMPLING_KEYWORDS:
                arguments.pop(name, None)
            if arguments["num_beams"] == 1:
                arguments.pop("length_penalty", None)
        if context.batch is None:
            return self.hooks.gpt_original(**arguments)
        device = arguments["text_inputs"].device
        key = ("gpt", _amp(torch, device.type), _settings_key(torch, arguments))
        return context.batch.park(Call("gpt", key, (), arguments))

    def inference(
        self,
        mu: Any,
        x_lens: Any,
        prompt: Any,
        style: Any,
        f0: Any,
        n_timesteps: Any,
        temperature: float = 1.0,
        inference_cfg_rate: float = 0.5,
    ) -> Any:
        context = current()
        if context is not None:
            n_timesteps, inference_cfg_rate = context.s2mel(n_timesteps, inference_cfg_rate)
        if context is None or (context.seed is None and context.batch is None):
            with autocast_bf16(context is not None and context.bf16_s2mel, mu) as bf16:
                out = self.hooks.cfm_original(
                    mu, x_lens, prompt, style, f0, n_timesteps, temperature, inference_cfg_rate
                )
            return out.to(mu.dtype) if bf16 else out
        torch = _torch()

        noise = context.noise(torch, [1, self.hooks.cfm.in_channels, mu.size(1)], mu.device) * temperature
        arguments = {
            "x": noise,
            "x_lens": x_lens,
            "prompt": prompt,
            "mu": mu,
            "style": style,
            "f0": f0,
            "n_timesteps": int(n_timesteps),
            "inference_cfg_rate": inference_cfg_rate,
        }
        if context.batch is None or mu.size(0) != 1:
            with autocast_bf16(context.bf16_s2mel, mu):
                return _solve(torch, self.hooks.cfm, [arguments])[0]
        key = (
            "cfm",
            tuple(mu.shape),
            tuple(prompt.shape),
            int(n_timesteps),
            float(inference_cfg_rate),
            f0 is None,
            str(mu.device),
            (mu.device.type, True, torch.bfloat16) if context.bf16_s2mel else _amp(torch, mu.device.type),
        )
        return context.batch.park(Call("cfm", key, (), arguments))

    def forward(self, x: Any) -> Any:
        context = current()
        bf16 = context is not None and context.bf16_vocoder
        if context is None or context.batch is None or not context.batch_vocoder or x.size(0) != 1:
            with vocoder_bf16(self.hooks.vocoder, bf16):
                return self.hooks.vocoder_original(x)
        torch = _torch()

        key = ("vocoder", tuple(x.shape), x.dtype, str(x.device), bf16, _amp(torch, x.device.type))
        return context.batch.park(Call("vocoder", key, (), {"x": x}))

    def estimate(self, x: Any, prompt_x: Any, x_lens: Any, t: Any, *args: Any, **kwargs: Any) -> Any:
        # Upstream's solver stacks one time step per guidance half ([t, t]), written for one
        # row each: with b rows a half, each row gets its half's time step.
        rows = int(x.size(0))
        if t.dim() == 1 and 0 < t.size(0) < rows and rows % t.size(0) == 0:
            t = t.repeat_interleave(rows // t.size(0))
        return self.estimator_original(x, prompt_x, x_lens, t, *args, **kwargs)

    def merge_emovec(self, speaker: Any, emotion: Any, *args: Any, **kwargs: Any) -> Any:
        # A voice's emotion vector (two conditioning encoders over its clips): upstream
        # recomputes it for every segment of every request.  The requests of a batch that
        # share a voice get it once, from upstream's own cached conditioning tensors.
        context = current()
        assert self.merge_original is not None
        if context is None or context.memo is None:
            return self.merge_original(speaker, emotion, *args, **kwargs)
        torch = _torch()

        amp = _amp(torch, speaker.device.type)
        key = ("merge_emovec", id(speaker), id(emotion), _plain(torch, args), _plain(torch, kwargs), amp)
        held = context.memo.get(key)
        if held is not None and held[0] is speaker and held[1] is emotion:
            return held[2]
        result = self.merge_original(speaker, emotion, *args, **kwargs)
        context.memo[key] = (speaker, emotion, result)  # the tensors held: their ids stay theirs
        return result

    def get_conditioning(self, inputs: Any, lengths: Any = None, *args: Any, **kwargs: Any) -> Any:
        # In a batched GPT call, rows of the same voice hold the same reference features:
        # the conditioning encoder runs once per distinct row.
        assert self.conditioning_original is not None
        if not getattr(_local, "dedupe_rows", False) or args or kwargs or int(inputs.size(0)) < 2:
            return self.conditioning_original(inputs, lengths, *args, **kwargs)
        torch = _torch()

        firsts, inverse = _distinct_rows(torch, inputs, lengths)
        if len(firsts) == int(inputs.size(0)):
            return self.conditioning_original(inputs, lengths)
        index = torch.tensor(firsts, device=inputs.device)
        once = self.conditioning_original(inputs.index_select(0, index), None if lengths is None else lengths[index])
        return once.index_select(0, torch.tensor(inverse, device=once.device))

    def latents(self, *args: Any, **kwargs: Any) -> Any:
        # The GPT's forward pass over a decoded segment (upstream's latents for s2mel): in a
        # batch, the rows whose every tensor has the same shape run as one pass.
        context = current()
        assert self.hooks.latent_original is not None and self.hooks.latent_signature is not None
        if context is None or context.batch is None:
            return self.hooks.latent_original(*args, **kwargs)
        torch = _torch()

        arguments = dict(self.hooks.latent_signature.bind(*args, **kwargs).arguments)
        if _var_keyword(self.hooks.latent_signature) in arguments or not _one_row(torch, arguments):
            return self.hooks.latent_original(*args, **kwargs)
        shapes = tuple(
            (name, tuple(value.shape), str(value.dtype), str(value.device))
            if isinstance(value, torch.Tensor)
            else (name, repr(value))
            for name, value in sorted(arguments.items())
        )
        device = next(v.device for v in arguments.values() if isinstance(v, torch.Tensor))
        key = ("latent", shapes, _amp(torch, device.type))
        return context.batch.park(Call("latent", key, (), arguments))


def _torch() -> Any:
    """torch, already imported by upstream when a model call is intercepted."""
    return importlib.import_module("torch")


def _var_keyword(signature: inspect.Signature) -> str:
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return name
    return "\0none"


def _amp(torch: Any, device_type: str) -> tuple[str, bool, Any]:
    """The calling thread's autocast state (thread-local in torch), to re-create around a batch."""
    try:
        return (device_type, bool(torch.is_autocast_enabled(device_type)), torch.get_autocast_dtype(device_type))
    except (TypeError, RuntimeError, AttributeError):  # a torch without per-device autocast queries
        return (device_type, False, None)


def _plain(torch: Any, value: Any) -> Any:
    """``value`` (arguments: tensors, numbers, containers) as a hashable key of its contents."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), str(value.device), tuple(value.shape), tuple(value.reshape(-1).tolist()))
    if isinstance(value, dict):
        return tuple(sorted((name, _plain(torch, item)) for name, item in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(torch, item) for item in value)
    return repr(value)


def _one_row(torch: Any, arguments: dict[str, Any]) -> bool:
    """Whether every tensor argument holds exactly one row (and there is one)."""
    tensors = [value for value in arguments.values() if isinstance(value, torch.Tensor)]
    return bool(tensors) and all(value.dim() > 0 and int(value.size(0)) == 1 for value in tensors)


def _distinct_rows(torch: Any, inputs: Any, lengths: Any) -> tuple[list[int], list[int]]:
    """The first row of each group of equal rows (with equal lengths), and each row's group."""
    firsts: list[int] = []
    inverse: list[int] = []
    for row in range(int(inputs.size(0))):
        for group, first in enumerate(firsts):
            same_length = lengths is None or bool(lengths[row] == lengths[first])
            if same_length and torch.equal(inputs[row], inputs[first]):
                inverse.append(group)
                break
        else:
            inverse.append(len(firsts))
            firsts.append(row)
    return firsts, inverse


def _settings_key(torch: Any, arguments: dict[str, Any]) -> tuple[Any, ...]:
    """What GPT rows must share to decode in one ``generate``: everything but the per-row tensors."""
    items: list[tuple[Any, ...]] = []
    for name, value in sorted(arguments.items()):
        if name in _SHARED and isinstance(value, torch.Tensor):
            items.append((name, tuple(value.reshape(-1).tolist())))
        elif isinstance(value, torch.Tensor):
            items.append((name, "tensor", str(value.dtype), str(value.device)))
        else:
            items.append((name, repr(value)))
    return tuple(items)


# ---------------------------------------------------------------- the coordinator's side


def run_calls(hooks: Hooks, calls: Sequence[Call], heartbeat: Callable[[str], Any]) -> None:
    """Run parked calls: those with the same key as one batch; set each call's result or error.

    ``heartbeat(message)`` returns a context manager that reports progress while a batch runs.
    A batch that raises is retried row by row, so that each row gets its own result or error.
    """
    torch = _torch()

    groups: dict[Any, list[Call]] = {}
    for call in calls:
        groups.setdefault(call.key, []).append(call)
    for key, group in groups.items():
        kind = group[0].kind
        message = f"{kind} batch of {len(group)}" if len(group) > 1 else kind
        with heartbeat(message):
            try:
                results = _run(torch, hooks, kind, key, group)
            except Exception as exc:
                if len(group) == 1:
                    group[0].error = exc
                    continue
                log.warning(
                    "a %s batch of %d failed (%s: %s): retrying row by row", kind, len(group), type(exc).__name__, exc
                )
                for call in group:
                    try:
                        call.result = _run(torch, hooks, kind, key, [call])[0]
                    except Exception as row_exc:
                        call.error = row_exc
                continue
        for call, result in zip(group, results, strict=True):
            call.result = result


def _run(torch: Any, hooks: Hooks, kind: str, key: Any, group: Sequence[Call]) -> list[Any]:
    amp = key[1] if kind == "gpt" else key[-1]
    device_type, enabled, dtype = amp
    with ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        if enabled:
            stack.enter_context(torch.autocast(device_type, enabled=True, dtype=dtype))
        if kind == "gpt":
            return _gpt(torch, hooks, group)
        if kind == "cfm":
            return _solve(torch, hooks.cfm, [call.kwargs for call in group])
        if kind == "latent":
            return _latents(torch, hooks, group)
        with vocoder_bf16(hooks.vocoder, key[-2]):
            return _vocoder(torch, hooks, group)


def _gpt(torch: Any, hooks: Hooks, group: Sequence[Call]) -> list[Any]:
    original = hooks.gpt_original
    if len(group) == 1:
        return [original(**group[0].kwargs)]
    rows = [call.kwargs for call in group]
    merged: dict[str, Any] = {}
    for name, first in rows[0].items():
        values = [row[name] for row in rows]
        if name in _SHARED or not isinstance(first, torch.Tensor):
            merged[name] = first
        elif name == "text_inputs":
            merged[name] = _pad_cat(torch, values, hooks.stop_text_token)
        elif name in _PADDED:
            merged[name] = _pad_cat(torch, values, _PADDED[name])
        elif name == "campplus_embedding" and first.dim() == 2:
            # 2.5 projects it and adds an axis only when it has two: (b, 1, d) keeps one per row.
            merged[name] = torch.cat(values, dim=0).unsqueeze(1)
        else:
            merged[name] = torch.cat(values, dim=0)
    _local.dedupe_rows = True
    try:
        out = original(**merged)
    finally:
        _local.dedupe_rows = False
    # Upstream's GPTs answer (codes, conditioning latent); indextts25-inference's, the codes alone.
    codes, latent = out if isinstance(out, tuple) else (out, None)
    stop = getattr(hooks.gpt, "stop_mel_token", None)
    results = []
    for i in range(len(rows)):
        row = codes[i : i + 1]
        if stop is not None:
            ends = (row[0] == stop).nonzero()
            if ends.numel():
                row = row[:, : int(ends[0, 0]) + 1]  # as decoded alone: it stops after its stop token
        results.append(row if latent is None else (row, latent[i : i + 1]))
    return results


def _pad_cat(torch: Any, values: Sequence[Any], pad: float) -> Any:
    """Rows of shape (1, ..., n_i) as one (b, ..., max n) tensor, padded with ``pad`` on the right."""
    width = max(int(value.shape[-1]) for value in values)
    padded = [torch.nn.functional.pad(value, (0, width - int(value.shape[-1])), value=pad) for value in values]
    return torch.cat(padded, dim=0)


def _solve(torch: Any, cfm: Any, rows: Sequence[dict[str, Any]]) -> list[Any]:
    """Upstream's Euler solver on the rows' own noise: one call for all rows (same length)."""
    first = rows[0]
    dtype = first["mu"].dtype  # under bf16 autocast (``bf16_s2mel``) the mel comes back as the input was
    t_span = torch.linspace(0, 1, first["n_timesteps"] + 1, device=first["mu"].device)
    with torch.inference_mode():
        if len(rows) == 1:
            out = cfm.solve_euler(
                first["x"],
                first["x_lens"],
                first["prompt"],
                first["mu"],
                first["style"],
                first["f0"],
                t_span,
                first["inference_cfg_rate"],
            )
            return [out.to(dtype)]
        out = cfm.solve_euler(
            torch.cat([row["x"] for row in rows], dim=0),
            first["x_lens"],  # upstream's own: the full length, shared by every row of the group
            torch.cat([row["prompt"] for row in rows], dim=0),
            torch.cat([row["mu"] for row in rows], dim=0),
            torch.cat([row["style"] for row in rows], dim=0),
            first["f0"],
            t_span,
            first["inference_cfg_rate"],
        )
    out = out.to(dtype)
    return [out[i : i + 1] for i in range(len(rows))]


def _vocoder(torch: Any, hooks: Hooks, group: Sequence[Call]) -> list[Any]:
    original = hooks.vocoder_original
    if len(group) == 1:
        return [original(group[0].kwargs["x"])]
    out = original(torch.cat([call.kwargs["x"] for call in group], dim=0))
    return [out[i : i + 1] for i in range(len(group))]


def _latents(torch: Any, hooks: Hooks, group: Sequence[Call]) -> list[Any]:
    """The GPT's forward for rows of equal shapes, as one pass: each tensor stacked on its first axis."""
    original = hooks.latent_original
    assert original is not None
    if len(group) == 1:
        return [original(**group[0].kwargs)]
    merged = {
        name: torch.cat([call.kwargs[name] for call in group], dim=0) if isinstance(value, torch.Tensor) else value
        for name, value in group[0].kwargs.items()
    }
    out = original(**merged)
    return [out[i : i + 1] for i in range(len(group))]
