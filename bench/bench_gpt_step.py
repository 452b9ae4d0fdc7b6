"""The same-output speed-ups (``gpt_speedups``, ``s2mel_speedups``) against upstream's path, on one loaded model.

Runs in upstream's venv, the adapter in process (a fixture of ``tests/upstream/fixture.py``:
tiny ``2``/``2.5``, or ``2-full``/``2.5-full``), the medium text of ``bench_gpu.py``, greedy
decoding with a seed (``do_sample=false``, ``seed=1``), ``--beams`` beams, ``--tokens`` codes.
The engine loads with both off (and, unless ``--prefix-cache``, without the voice prefix
cache: each request computes its prefill, as upstream does; with it, ours keeps the voice's
prefix from request to request, as the default load does, and upstream's path runs without it);
each round runs one request on upstream's path and one with
the speed-ups (``_gpt_fast.install(..., keep_weights=True)`` with ``--parts``, and
``_s2mel_fast.install`` with ``--s2mel-parts``; taken off again by each ``uninstall``), in
alternating order.  For each request:

- ``step_s``: the median time of a decoding step, from one step's forward pass to the next's
  (the pass, the beam search's bookkeeping and its reordering of the cache);
- ``gpt_s``: the GPT stage (``gpt.inference_speech``: conditioning, prefill, decoding);
- ``s2mel_s``: the flow-matching solver (``cfm.solve_euler``), ``vocoder_s``: BigVGAN;
- ``wall_s``: the whole request;
- the codes it decoded and its int16 samples: the speed-ups must give the same codes and audio
  within one int16 step (``codes_equal``, ``max_sample_step``).

The floor of a step is measured in the same run: this process's memory-read bandwidth (the
best of several ``sum()`` over 256 MiB, as ``_floor.py``, taken again each round: the floor is
the median's) and the bytes a step reads, the decoder's weights plus each row's keys and values
at the mean context::

    $(python3 tests/upstream/build_venv.py github) bench/bench_gpt_step.py 2 CKPT_DIR --rounds 3

(``PYTHONPATH`` holding this checkout, ``bench/`` and upstream's.)  Prints a table and, with
``--json``, writes the figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
from _floor import bandwidth

from indextts_sidecar.engines import SynthesisRequest
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine, _gpt_fast, _s2mel_fast

#: What each request's figures are kept for.
STAGES = ("wall_s", "gpt_s", "s2mel_s", "vocoder_s", "step_s")
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs back to the woods."


class Recorder:
    """Times ``inference_speech`` and each decoding step; keeps the codes."""

    def __init__(self, gpt: Any, model: Any = None) -> None:
        self.gpt_s = self.s2mel_s = self.vocoder_s = 0.0
        self.started = 0.0
        self.starts: list[float] = []
        self.contexts: list[int] = []
        self.codes: list[list[int]] = []
        speech, forward = gpt.inference_speech, gpt.inference_model.forward

        @functools.wraps(speech)
        def timed_speech(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            out = speech(*args, **kwargs)
            self.gpt_s += time.perf_counter() - started
            codes = out[0] if isinstance(out, tuple) else out
            self.codes.extend(getattr(codes, "sequences", codes).tolist())
            return out

        @functools.wraps(forward)  # Hugging Face's generate reads its signature
        def timed_forward(*args: Any, **kwargs: Any) -> Any:
            ids = kwargs.get("input_ids")
            if ids is not None and int(ids.shape[1]) == 1:  # a decoding step, not the prefill
                self.starts.append(time.perf_counter())
                self.contexts.append(int(kwargs["attention_mask"].shape[1]))
            return forward(*args, **kwargs)

        gpt.inference_speech = timed_speech
        gpt.inference_model.forward = timed_forward
        if model is not None:  # s2mel's solver and the vocoder
            cfm = model.s2mel.models["cfm"]
            solve = cfm.solve_euler  # what inference calls, and the adapter's seeded path

            @functools.wraps(solve)
            def timed_solve(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                out = solve(*args, **kwargs)
                self.s2mel_s += time.perf_counter() - started
                return out

            cfm.solve_euler = timed_solve
            model.bigvgan.register_forward_pre_hook(lambda *_: setattr(self, "started", time.perf_counter()))
            model.bigvgan.register_forward_hook(lambda *_: self._vocoded())

    def _vocoded(self) -> None:
        self.vocoder_s += time.perf_counter() - self.started

    def reset(self) -> None:
        self.gpt_s = self.s2mel_s = self.vocoder_s = 0.0
        self.starts.clear()
        self.contexts.clear()
        self.codes.clear()


def speak(engine: Any, cls: Any, ckpt: str, args: argparse.Namespace, recorder: Recorder) -> dict[str, Any]:
    base = {"max_mel_tokens": args.tokens, "first_segment_tokens": 0, "do_sample": False, "seed": 1}
    base["num_beams"] = args.beams
    if args.diffusion_steps:
        base["diffusion_steps"] = args.diffusion_steps
    options = msgspec.convert(base, cls.RequestOptions)
    request = SynthesisRequest(id=1, text=TEXT, voice=f"{ckpt}/voice.wav", emotion=None, options=options)
    recorder.reset()
    samples = []
    started = time.perf_counter()
    for chunk in engine.synthesize(request, lambda *a: None, lambda: False):
        samples.append(np.asarray(chunk, dtype=np.int16))
    wall = time.perf_counter() - started
    hits = engine.request_facts().get("prefix_cache", {}).get("hits", 0)
    steps = [later - earlier for earlier, later in zip(recorder.starts[:-1], recorder.starts[1:], strict=True)]
    audio = np.concatenate([s.reshape(-1) for s in samples]) if samples else np.zeros(0)
    return {
        "wall_s": wall,
        "gpt_s": recorder.gpt_s,
        "s2mel_s": recorder.s2mel_s,
        "vocoder_s": recorder.vocoder_s,
        "step_s": statistics.median(steps) if steps else None,
        "steps": len(recorder.starts),
        "mean_context": statistics.mean(recorder.contexts) if recorder.contexts else 0,
        "codes": list(recorder.codes),
        "prefix_hits": hits,
        "audio": audio,
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", choices=["2", "2.5"])
    parser.add_argument("ckpt")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=60)
    parser.add_argument("--beams", type=int, default=3)
    parser.add_argument("--diffusion-steps", type=int, default=0, help="s2mel steps (0: upstream's 25)")
    parser.add_argument("--parts", default=",".join(_gpt_fast.PARTS), help="the GPT's speed-ups to install")
    parser.add_argument("--s2mel-parts", default=",".join(_s2mel_fast.PARTS), help="s2mel's ('' for none)")
    parser.add_argument(
        "--prefix-cache",
        action="store_true",
        help="ours with the voice prefix cache as loaded by default (the voice repeats: each request reuses it)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cls = IndexTTS2Engine if args.version == "2" else IndexTTS25Engine
    options = {"model_dir": args.ckpt, "device": "cpu", "use_qwen_emo": False}
    options.update(gpt_speedups=False, s2mel_speedups=False)
    if not args.prefix_cache:
        options["prefix_cache"] = 0  # every request computes its prefill, as upstream does
    engine = cls(msgspec.convert(options, cls.Options))
    engine.load(lambda *a: None, lambda: False)
    model = engine._model
    gpt = model.gpt
    weights = sum(p.numel() * p.element_size() for m in (gpt.gpt, gpt.final_norm, gpt.mel_head) for p in m.parameters())
    reads = []  # the bandwidth, measured again each round: it drifts with the machine
    recorder = Recorder(gpt, model)
    parts = [part for part in args.parts.split(",") if part]
    s2mel_parts = [part for part in args.s2mel_parts.split(",") if part]
    store, entries = engine._prefix, engine._prefix.entries  # the default bound (--prefix-cache) or 0

    def use(mode: str) -> None:
        if mode == "speedups":
            report = _gpt_fast.install(model, parts=parts, keep_weights=True)
            report.update(_s2mel_fast.install(model, parts=s2mel_parts))
            assert all(report[part] == "on" for part in (*parts, *s2mel_parts)), report
        else:
            _gpt_fast.uninstall(model)
            _s2mel_fast.uninstall(model)
        # Upstream's path has no prefix cache; ours keeps the voice's across its requests.
        store.entries = entries if mode == "speedups" else 0

    for mode in ("upstream", "speedups") if args.prefix_cache else ("upstream",):
        use(mode)  # upstream's first request is slower than the rest; ours fills the prefix cache
        speak(engine, cls, args.ckpt, args, recorder)
    runs: dict[str, list[dict[str, Any]]] = {"upstream": [], "speedups": []}
    for number in range(args.rounds):
        reads.append(bandwidth(torch, "cpu")["bytes_per_s"])
        order = ("upstream", "speedups") if number % 2 == 0 else ("speedups", "upstream")
        for mode in order:
            use(mode)
            runs[mode].append(speak(engine, cls, args.ckpt, args, recorder))
    use("upstream")
    layers, dim = int(gpt.layers), int(gpt.model_dim)
    first = runs["upstream"][0]
    kv_row = 2 * layers * dim * first["mean_context"] * 4
    read = statistics.median(reads)
    floor = (weights + args.beams * kv_row) / read  # at the median bandwidth
    same_codes = all(run["codes"] == first["codes"] for mode in runs for run in runs[mode])
    steps_apart = max(
        int(np.abs(run["audio"].astype(np.int64) - first["audio"].astype(np.int64)).max())
        if run["audio"].shape == first["audio"].shape
        else 1 << 16
        for mode in runs
        for run in runs[mode]
    )
    figures: dict[str, Any] = {
        "version": args.version,
        "ckpt": Path(args.ckpt).name,
        "tokens": args.tokens,
        "beams": args.beams,
        "parts": [part for part in args.parts.split(",") if part],
        "s2mel_parts": s2mel_parts,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "bandwidth_bytes_per_s": spread(reads),
        "weight_bytes": weights,
        "floor_step_s": floor,
        "codes_equal": same_codes,
        "max_sample_step": steps_apart,
        "decoded": [len(row) for row in first["codes"]],
        "prefix_cache": args.prefix_cache,
        "prefix_hits": {mode: [run["prefix_hits"] for run in values] for mode, values in runs.items()},
    }
    step_bytes = weights + args.beams * kv_row
    for mode, values in runs.items():
        figures[mode] = {name: spread([run[name] for run in values]) for name in STAGES}
        # each round's step over its own floor (that round's bandwidth)
        over = [run["step_s"] * read / step_bytes for run, read in zip(values, reads, strict=True)]
        figures[mode]["step_over_floor"] = spread(over)
    pairs = list(zip(runs["upstream"], runs["speedups"], strict=True))
    figures["speedup"] = {name: spread([up[name] / ours[name] for up, ours in pairs]) for name in STAGES}
    head = f"IndexTTS-{args.version} {figures['ckpt']}: {args.beams} beams, {args.tokens} codes"
    print(f"{head}, floor {floor * 1e3:.1f} ms")
    print(f"codes equal: {same_codes}; audio within {steps_apart} int16 step(s)")
    print("| path | step (ms) | over floor | GPT (s) | s2mel (s) | vocoder (s) | whole (s) |")
    print("|---|---|---|---|---|---|---|")
    for mode in runs:
        f = figures[mode]
        print(
            f"| {mode} | {f['step_s']['median'] * 1e3:.1f} | {f['step_over_floor']['median']:.2f} "
            f"| {f['gpt_s']['median']:.2f} | {f['s2mel_s']['median']:.2f} | {f['vocoder_s']['median']:.2f} "
            f"| {f['wall_s']['median']:.2f} |"
        )
    s = figures["speedup"]
    print(
        "speed-up (upstream / speedups, per round): "
        + ", ".join(f"{n} {s[n]['median']:.2f} ({s[n]['min']:.2f}-{s[n]['max']:.2f})" for n in s)
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    if not same_codes or steps_apart > 1:
        sys.exit("the speed-ups changed the output")


if __name__ == "__main__":
    main()
