"""Run in an upstream venv: the fast profile's knobs, the adapter driven in process.

``probe_profile.py VERSION CHECKPOINTS OUT`` writes ``OUT/report.json`` with, per case, what
the model calls saw (each s2mel solve's rows, steps and guidance rate; each GPT decoding's
beams), the ``request_facts()`` after each request, and the engine's ``info()``:

``knobs``
    on a CPU read as one without bf16 (``_profile._cpu_flags`` replaced): the refusal of an
    explicit ``bf16_weights=true``, ``bf16_s2mel=true`` and ``bf16_vocoder=true`` (before any load); then
    one engine (``profile=fast``, so loaded without bf16, and ``diffusion_steps=4`` over the
    profile's 10; ``max_batch=4``, ``batch_stages=all``) and three lone requests: no options (the
    engine's knobs), ``profile=default`` (none), and ``cfg_rate=0.5`` with ``num_beams=2`` (the
    request's over the engine's); a request's own ``bf16_s2mel=true``, refused; then two identical
    greedy requests (same text, voice and seed, ``profile=default``) as one batch, and again with
    the second at ``diffusion_steps=5``: equal CFM rows share a solve only when their knobs are
    equal;
``bf16``
    ``bf16_weights=true`` on this CPU (with ``max_batch=4``, ``batch_stages=all``): loaded, or its
    refusal (code, field, message); loaded, a request with ``bf16_s2mel=true``, one with
    ``bf16_vocoder=true``, and two batches of two greedy requests, both with both knobs and one
    with, one without.

A solve that ran under bfloat16 autocast is marked ``"bf16"`` after its guidance rate; each
vocoder call is recorded apart (``vocoder``: its rows, and ``"bf16"`` when its wide convolutions
ran in bfloat16, ``bf16_vocoder``).  The tiny fixtures' vocoders are narrower than
``_precision.VOCODER_MIN_CHANNELS``: the probe lowers it to :data:`WIDE`, so that their
convolutions are swapped as a full-size vocoder's are.
``tests/upstream/test_profile.py`` runs it and judges the results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import torch

from indextts_sidecar.engines import BatchItem, EngineError, ItemDone, SynthesisRequest
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine, _precision, _profile

TEXT = "Hello there."
#: The narrowest convolution swapped to bf16 here (a tiny vocoder starts at 64 channels, halved by each upsampling).
WIDE = 8


class Calls:
    """Each s2mel solve (rows, steps, rate) and each GPT decoding's beams, on one loaded model."""

    def __init__(self, model: Any) -> None:
        self.seen: list[list[Any]] = []
        self.vocoder: list[list[Any]] = []
        cfm, gpt = model.s2mel.models["cfm"], model.gpt
        # The vocoder's first wide convolution, once a call: swapped to bf16 while bf16_vocoder runs.
        wide = next(m for m in model.bigvgan.modules() if isinstance(m, torch.nn.Conv1d) and m.in_channels >= WIDE)

        def seen_vocoder(module: Any, inputs: Any) -> None:
            self.vocoder.append(["vocoder", int(inputs[0].size(0)), *(["bf16"] if "forward" in vars(module) else [])])

        wide.register_forward_pre_hook(seen_vocoder)
        solve, decode = cfm.solve_euler, gpt.inference_speech

        def solve_euler(x: Any, x_lens: Any, prompt: Any, mu: Any, style: Any, f0: Any, t_span: Any, rate: Any) -> Any:
            bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            self.seen.append(["cfm", int(x.size(0)), int(t_span.numel()) - 1, float(rate), *(["bf16"] if bf16 else [])])
            return solve(x, x_lens, prompt, mu, style, f0, t_span, rate)

        def inference_speech(*args: Any, **kwargs: Any) -> Any:
            self.seen.append(["gpt", kwargs.get("num_beams")])
            return decode(*args, **kwargs)

        import functools

        cfm.solve_euler = solve_euler
        gpt.inference_speech = functools.wraps(decode)(inference_speech)

    def take(self) -> list[list[Any]]:
        seen, self.seen = self.seen, []
        return seen

    def take_vocoder(self) -> list[list[Any]]:
        seen, self.vocoder = self.vocoder, []
        return seen


def engine_of(cls: Any, ckpt: str, **options: Any) -> Any:
    engine = cls(msgspec.convert({"model_dir": ckpt, "device": "cpu", "use_qwen_emo": False, **options}, cls.Options))
    engine.load(lambda *a: None, lambda: False)
    return engine


def request(cls: Any, ckpt: str, i: int, **options: Any) -> SynthesisRequest[Any]:
    base = {"max_mel_tokens": 6, **options}
    return SynthesisRequest(
        id=i,
        text=TEXT,
        voice=f"{ckpt}/voice.wav",
        emotion=None,
        options=msgspec.convert(base, cls.RequestOptions),
    )


def knobs(cls: Any, ckpt: str) -> dict[str, Any]:
    """One engine: ``profile=fast`` with ``diffusion_steps=4``, on a CPU read as one without bf16."""
    real_flags = _profile._cpu_flags
    _profile._cpu_flags = lambda: {"fpu", "avx2"}  # a CPU without bf16 matrix instructions
    out: dict[str, Any] = {}
    try:
        engine_of(cls, ckpt, bf16_weights=True)
    except EngineError as exc:
        out["refused"] = [exc.code, exc.field, str(exc), exc.retryable]
    for name in ("bf16_s2mel", "bf16_vocoder"):
        try:
            engine_of(cls, ckpt, **{name: True})
        except EngineError as exc:
            out[f"refused_{name}"] = [exc.code, exc.field, str(exc), exc.retryable]
    engine = engine_of(cls, ckpt, profile="fast", diffusion_steps=4, max_batch=4, batch_stages="all")
    _profile._cpu_flags = real_flags
    out["info"] = engine.info()
    out["gpt_dtypes"] = sorted({str(p.dtype) for p in engine._model.gpt.parameters()})
    calls = Calls(engine._model)
    lone = []
    for i, options in enumerate(({}, {"profile": "default"}, {"cfg_rate": 0.5, "num_beams": 2})):
        pieces = list(engine.synthesize(request(cls, ckpt, i, **options), lambda *a: None, lambda: False))
        facts = engine.request_facts()
        lone.append({"samples": int(sum(p.size for p in pieces)), "facts": facts, "calls": calls.take()})
    out["lone"] = lone
    out["lone_vocoder"] = calls.take_vocoder()
    for name in ("bf16_s2mel", "bf16_vocoder"):
        try:
            list(engine.synthesize(request(cls, ckpt, 9, **{name: True}), lambda *a: None, lambda: False))
        except EngineError as exc:
            out[f"refused_request_{name}"] = [exc.code, exc.field, str(exc)]
    # A batch of two identical greedy requests on upstream's path, then one with other steps.
    greedy = {"do_sample": False, "seed": 3, "profile": "default"}
    for name, second in (("same", {}), ("apart", {"diffusion_steps": 5})):
        items = [
            BatchItem(request(cls, ckpt, 0, **greedy), lambda *a: None, lambda: False),
            BatchItem(request(cls, ckpt, 1, **greedy, **second), lambda *a: None, lambda: False),
        ]
        facts: dict[int, Any] = {}
        samples = [0, 0]
        for index, value in engine.synthesize_batch(items):
            if isinstance(value, ItemDone):
                assert value.error is None, value.error
                facts[index] = engine.request_facts()
            else:
                samples[index] += int(value.size)
        out[name] = {"calls": calls.take(), "facts": [facts[0], facts[1]], "samples": samples}
    engine.unload()
    return out


def bf16(cls: Any, ckpt: str) -> dict[str, Any]:
    """``bf16_weights=true`` on this CPU: loaded (and requests run), or refused."""
    try:
        engine = engine_of(cls, ckpt, bf16_weights=True, max_batch=4, batch_stages="all")
    except EngineError as exc:
        return {"error": [exc.code, exc.field, str(exc), exc.retryable]}
    out = {"info": engine.info(), "gpt_dtypes": sorted({str(p.dtype) for p in engine._model.gpt.parameters()})}
    pieces = list(engine.synthesize(request(cls, ckpt, 0), lambda *a: None, lambda: False))
    out["samples"] = int(sum(p.size for p in pieces))
    out["facts"] = engine.request_facts()
    calls = Calls(engine._model)
    for i, name in enumerate(("bf16_s2mel", "bf16_vocoder"), start=1):
        pieces = list(engine.synthesize(request(cls, ckpt, i, **{name: True}), lambda *a: None, lambda: False))
        out[name.removeprefix("bf16_")] = {
            "samples": int(sum(p.size for p in pieces)),
            "facts": engine.request_facts(),
            "calls": calls.take(),
            "vocoder": calls.take_vocoder(),
        }
    greedy = {"do_sample": False, "seed": 3}
    both = {"bf16_s2mel": True, "bf16_vocoder": True}
    for name, second in (("bf16_same", both), ("bf16_apart", {})):
        items = [
            BatchItem(request(cls, ckpt, 0, **greedy, **both), lambda *a: None, lambda: False),
            BatchItem(request(cls, ckpt, 1, **greedy, **second), lambda *a: None, lambda: False),
        ]
        samples = [0, 0]
        for index, value in engine.synthesize_batch(items):
            if isinstance(value, ItemDone):
                assert value.error is None, value.error
            else:
                samples[index] += int(value.size)
        out[name] = {"calls": calls.take(), "vocoder": calls.take_vocoder(), "samples": samples}
    return out


def main() -> None:
    version, ckpt, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    torch.set_num_threads(1)
    _precision.VOCODER_MIN_CHANNELS = WIDE
    cls = IndexTTS2Engine if version == "2" else IndexTTS25Engine
    report = {"knobs": knobs(cls, ckpt), "bf16": bf16(cls, ckpt)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print("ok")


if __name__ == "__main__":
    main()
