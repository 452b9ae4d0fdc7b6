"""Run in an upstream venv: the same-output speed-ups (``_gpt_fast.py``, ``_s2mel_fast.py``), the adapter in process.

``probe_gpt_fast.py VERSION CHECKPOINTS OUT`` writes ``OUT/report.json``.  Every request is
greedy (``do_sample=False``, a seed), so its GPT codes are a function of its inputs; the probe
records each request's codes (row by row) and int16 samples, and a lone request's first logits:

``off``
    an engine loaded with ``gpt_speedups=false`` and ``s2mel_speedups=false``: a request at
    upstream's three beams, one at one beam (another text), and the two in a batch
    (``max_batch=2``); its ``info()``;
``on``
    the same engine after both modules' ``install`` (what they reported; the GPT's with
    ``keep_weights``): the same requests, how many of the GPT-2 stack's ``Conv1D`` layers still
    hold a float weight, the widest input the DiT's transformer, its last block's feed-forward
    layer and its WaveNet saw (``frames``: the tail and the last layer crop the reference's
    frames off), how many of the DiT's attention calls had a mask (``attention``), and the DiT
    over two rows of other lengths, whose mask masks frames (``masked_rows``);
``restored``
    the same engine after both ``uninstall``: the same requests (upstream's path again, so the
    same samples bit for bit).

One load serves all three (the tiny fixtures leave some weights to the constructor's random
initialisation, so two loads are two models unless seeded alike); an engine loaded with the
defaults reports the speed-ups on in ``probe_prefix.py``.
``cache``
    the beam cache beside transformers' ``DynamicCache`` on random keys and values through
    updates through several regrowths of its buffers, reorders (swaps, cycles, duplicates, none), a repeat, a
    selection and a crop: whether every layer's keys and values stayed equal (None where the
    installed transformers has no such cache: the PyPI flavours').
``tests/upstream/test_gpt_fast.py`` runs it and judges the results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from probe_prefix import Codes, batch, lone, request  # scripts beside this one: their folder is on the path
from probe_profile import engine_of

from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine, _gpt_fast, _s2mel_fast

OTHER = "The quick brown fox jumps."


def requests(cls: Any, ckpt: str) -> list[Any]:
    return [request(cls, ckpt, 0), request(cls, ckpt, 1, text=OTHER, num_beams=1)]


def speak(engine: Any, codes: Codes, cls: Any, ckpt: str) -> dict[str, Any]:
    lone_runs = [lone(engine, codes, r) for r in requests(cls, ckpt)]
    together = batch(engine, codes, requests(cls, ckpt))
    return {
        "lone": [{"codes": r["codes"], "logits": r["logits"], "samples": r["samples"]} for r in lone_runs],
        "batch": {"codes": together["codes"], "samples": together["samples"]},
    }


def frames_seen(model: Any) -> dict[str, int]:
    """Hooks that record the widest input of the DiT's transformer, of its last block's
    feed-forward layer and of its WaveNet's first layer; and how many of the DiT's attention
    calls were given a mask (``masked``) or none (``unmasked``)."""
    estimator = model.s2mel.models["cfm"].estimator
    seen = {"transformer": 0, "last_feed_forward": 0, "wavenet": 0, "masked": 0, "unmasked": 0}
    dit = sys.modules[type(estimator.transformer.layers[0].attention).__module__]
    functional = dit.F

    class Recording:
        def __getattr__(self, name: str) -> Any:
            return getattr(functional, name)

        def scaled_dot_product_attention(self, *args: Any, **kwargs: Any) -> Any:
            seen["masked" if kwargs.get("attn_mask") is not None else "unmasked"] += 1
            return functional.scaled_dot_product_attention(*args, **kwargs)

    dit.F = Recording()  # the DiT module's own ``F``: other models' attention is not counted

    def hook(name: str, axis: int) -> Any:
        def record(module: Any, args: Any) -> None:
            seen[name] = max(seen[name], int(args[0].shape[axis]))

        return record

    estimator.transformer.register_forward_pre_hook(hook("transformer", 1))
    estimator.transformer.layers[-1].feed_forward.register_forward_pre_hook(hook("last_feed_forward", 1))
    estimator.wavenet.in_layers[0].register_forward_pre_hook(hook("wavenet", -1))
    return seen


def masked_rows(model: Any) -> list[list[float]]:
    """The DiT's estimate for two rows of random inputs, the second 7 frames shorter (its mask
    masks them): what ``mask_skip`` must leave as it was."""
    estimator = model.s2mel.models["cfm"].estimator
    generator = torch.Generator().manual_seed(1)
    frames, channels = 40, estimator.in_channels
    hidden = estimator.cond_projection.out_features
    style = estimator.cond_x_merge_linear.in_features - 2 * channels - hidden
    with torch.no_grad():
        out = estimator(
            torch.randn(2, channels, frames, generator=generator),
            torch.randn(2, channels, frames, generator=generator),
            torch.tensor([frames, frames - 7]),
            torch.rand(2, generator=generator),
            torch.randn(2, style, generator=generator),
            torch.randn(2, frames, estimator.cond_projection.in_features, generator=generator),
        )
    return [[float(v) for v in row] for row in out[:, :, : frames - 7].flatten(1)]


def float_weights(model: Any) -> int:
    return sum(1 for layer in _gpt_fast._packable(model.gpt) if layer.weight is not None)


def cache_check() -> Any:
    """The beam cache against ``DynamicCache``, operation by operation; None where it does not apply."""
    utils = __import__("transformers.cache_utils", fromlist=["DynamicCache"])
    dynamic = utils.DynamicCache
    if hasattr(dynamic(), "layers"):
        return None
    ours, theirs = _gpt_fast._beam_cache_class(dynamic)(), dynamic()
    generator = torch.Generator().manual_seed(0)
    layers, rows, heads, width = 2, 3, 2, 4
    results = []

    def in_rows(beams: torch.Tensor) -> torch.Tensor:
        """Each beam's new keys (or values) in the cache row that holds its past, as the decoding
        step's forward pass computes them (``_in_cache_order``)."""
        if ours.rows is None:
            return beams
        out = torch.empty_like(beams)
        out[torch.tensor(ours.rows)] = beams
        return out

    def update(length: int) -> None:
        for layer in range(layers):
            key = torch.randn(rows_now[0], heads, length, width, generator=generator)
            value = torch.randn(rows_now[0], heads, length, width, generator=generator)
            a, b = ours.update(in_rows(key), in_rows(value), layer), theirs.update(key, value, layer)
            results.append(torch.equal(ours._beams(a[0]), b[0]) and torch.equal(ours._beams(a[1]), b[1]))

    def same() -> bool:
        # In beam order: the beam cache moves rows only where two beams share a past.
        pairs = [
            (a, b)
            for ours_layer, theirs_layer in zip(ours.to_legacy_cache(), theirs.to_legacy_cache(), strict=True)
            for a, b in zip(ours_layer, theirs_layer, strict=True)
        ]
        return ours.get_seq_length() == theirs.get_seq_length() and all(torch.equal(a, b) for a, b in pairs)

    rows_now = [rows]
    moved = 0  # steps after which some beam's past sat in another beam's row
    update(5)  # a prefill
    for step, order in enumerate([[0, 1, 2], [1, 0, 2], [2, 0, 1], [0, 0, 1], [2, 2, 2], [1, 2, 0]] * 50):
        update(1)
        ours.reorder_cache(torch.tensor(order))
        theirs.reorder_cache(torch.tensor(order))
        moved += ours.rows is not None
        results.append(same())
        if step == 3:
            ours.crop(-2)
            theirs.crop(-2)
            results.append(same())
    ours.batch_repeat_interleave(2)
    theirs.batch_repeat_interleave(2)
    rows_now[0] = rows * 2
    results.append(same())
    update(3)
    selected = torch.tensor([5, 0, 2])
    ours.batch_select_indices(selected)
    theirs.batch_select_indices(selected)
    rows_now[0] = 3
    results.append(same())
    update(1)
    results.append(same())
    return {"checks": len(results), "equal": all(results), "length": ours.get_seq_length(), "moved": moved}


def main() -> None:
    version, ckpt, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    torch.set_num_threads(1)
    cls = IndexTTS2Engine if version == "2" else IndexTTS25Engine
    report: dict[str, Any] = {}
    # The tiny fixtures leave some weights to the constructors' random initialisation: seeded, every
    # run loads the same model (unseeded, about one load in ten spoke both texts alike).
    torch.manual_seed(0)
    engine = engine_of(cls, ckpt, max_batch=2, prefix_cache=0, gpt_speedups=False, s2mel_speedups=False)
    model = engine._model
    codes, seen = Codes(model), frames_seen(model)
    report["off"] = speak(engine, codes, cls, ckpt)
    report["off_info"] = {name: engine.info()[name] for name in ("gpt_speedups", "s2mel_speedups")}
    report["off_float_weights"] = float_weights(model)
    report["off_frames"] = dict(seen)
    report["off_masked_rows"] = masked_rows(model)
    report["installed"] = _gpt_fast.install(model, keep_weights=True)
    report["installed_s2mel"] = _s2mel_fast.install(model)
    seen.update(dict.fromkeys(seen, 0))
    report["on"] = speak(engine, codes, cls, ckpt)
    report["on_float_weights"] = float_weights(model)
    report["on_frames"] = dict(seen)
    report["on_masked_rows"] = masked_rows(model)
    _gpt_fast.uninstall(model)
    _s2mel_fast.uninstall(model)
    report["restored"] = speak(engine, codes, cls, ckpt)
    engine.unload()
    report["cache"] = cache_check()
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, default=str))
    print("ok")


if __name__ == "__main__":
    main()
