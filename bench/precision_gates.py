"""Precision gates: what a fast path changes, measured against upstream's path on the same inputs.

Runs in upstream's venv with this repository and the GitHub checkout on ``PYTHONPATH``, on a
conformance fixture (``tests/upstream/fixture.py 2|2.5|2-full|2.5-full DIR``) or a real
checkpoint directory, driving the adapter in process::

    PYTHONPATH=.:../shared/upstream/index-tts $INDEXTTS_UPSTREAM_PYTHON bench/precision_gates.py 2.5 DIR \\
        --profile fast [--knob diffusion_steps=10 ...] [--tokens 20] [--rounds 1] [--json OUT] \\
        [--require token_match=0.9 --require mel_cosine=0.95 --require snr_db=10] [--hold-both]

Both paths run the same requests: each text of ``--texts`` with the fixture's ``voice.wav``
(``--voice`` for another), greedy (``do_sample=False``, so that a difference is the knobs',
not the sampler's), a seed each, at most ``--tokens`` GPT tokens.  The baseline is upstream's
path with upstream's own three beams (``num_beams=3``); the candidate is the same requests
with the knobs: ``--profile fast`` and each ``--knob NAME=VALUE`` (``diffusion_steps``,
``cfg_rate``, ``num_beams``, ``bf16_s2mel``, ``bf16_vocoder``: request options;
``bf16_weights``: the engine's).  A knob given overrides the profile's.  Where the two differ
in request knobs only, one engine serves both and each text runs on both paths back to back,
the order alternating round by round, so that the machine's drift (1.5x within minutes here)
falls on both alike; ``speedup_rounds`` gives each round's ratio.  An engine knob
(``bf16_weights``, and ``--profile fast``, which turns it on where the device has bf16) needs
a second engine: by default the baseline runs all its rounds and is unloaded before the
candidate loads (full-size models are not held twice), and ``--hold-both`` holds both and
interleaves them (twice the memory).

The gates, per input and over all:

``token_match``
    the GPT codes of each segment, position by position: the share of the baseline's tokens
    the candidate decoded identically (a shorter or longer candidate counts its missing or
    extra positions as mismatches);
``mel_cosine``
    per segment, the s2mel decoder's output mel (what ``solve_euler`` returns) against the
    baseline's, as one vector over the frames both have (1.0: the same direction);
``snr_db``
    the candidate's int16 audio against the baseline's, over the samples both have:
    10 log10(signal energy / difference energy); ``inf`` when identical;
``speedup``
    the baseline's wall time over the candidate's (all inputs, ``--rounds`` rounds, after one
    warm-up request each), and each of upstream's stage times (``done.facts["stages"]``).

Prints a table and writes the JSON (``--json``; an infinite SNR as ``Infinity``, as Python's
``json`` writes and reads it); with ``--require GATE=MIN`` (``speedup`` too)
it exits 1 when a gate falls below its minimum.  What each model call saw (the CFM's steps,
guidance rate and rows, the GPT's beams) is in ``calls``, and the candidate's ``done.facts``
in ``facts``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import torch

from indextts_sidecar.engines import SynthesisRequest
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine

TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello there, this is a test of the fast profile.",
)
#: Request options that are knobs (the rest of ``--knob`` goes to the engine: ``bf16_weights``).
REQUEST_KNOBS = ("diffusion_steps", "cfg_rate", "num_beams", "bf16_s2mel", "bf16_vocoder")
ENGINE_KNOBS = ("bf16_weights",)
#: Upstream's own beams, the baseline's.
UPSTREAM_BEAMS = 3
GATES = ("token_match", "mel_cosine", "snr_db", "speedup")


class Recorder:
    """What one model's calls saw and returned, request by request: the GPT's codes, the CFM's mels."""

    def __init__(self) -> None:
        self.codes: list[list[int]] = []
        self.mels: list[np.ndarray] = []
        self.calls: dict[str, list[Any]] = {"num_beams": [], "diffusion_steps": [], "cfg_rate": [], "cfm_rows": []}

    def take(self) -> tuple[list[list[int]], list[np.ndarray], dict[str, list[Any]]]:
        """What the calls since the last take saw (one request's), and a fresh start."""
        taken = self.codes, self.mels, self.calls
        self.codes, self.mels, self.calls = [], [], {name: [] for name in self.calls}
        return taken

    def install(self, model: Any) -> None:
        """Wrap the GPT's decoding and the CFM's solver on the instance (before the adapter's
        interceptors, which then call these as upstream's)."""
        gpt, cfm = model.gpt, model.s2mel.models["cfm"]
        decode, solve = gpt.inference_speech, cfm.solve_euler
        stop = getattr(gpt, "stop_mel_token", None)

        @functools.wraps(decode)  # its signature: the adapter's interceptor binds arguments by it
        def inference_speech(*args: Any, **kwargs: Any) -> Any:
            self.calls["num_beams"].append(kwargs.get("num_beams"))
            out = decode(*args, **kwargs)
            codes = out[0] if isinstance(out, tuple) else out
            for row in codes.tolist():
                self.codes.append(row[: row.index(stop) + 1] if stop in row else row)
            return out

        def solve_euler(
            x: Any, x_lens: Any, prompt: Any, mu: Any, style: Any, f0: Any, t_span: Any, rate: Any = 0.5
        ) -> Any:
            self.calls["diffusion_steps"].append(int(t_span.numel()) - 1)
            self.calls["cfg_rate"].append(float(rate))
            self.calls["cfm_rows"].append(int(x.size(0)))
            out = solve(x, x_lens, prompt, mu, style, f0, t_span, rate)
            for i in range(int(out.size(0))):
                self.mels.append(out[i].float().cpu().numpy())
            return out

        gpt.inference_speech = inference_speech
        cfm.solve_euler = solve_euler


class Engine:
    """One loaded engine with its recorder; the baseline and the candidate share one when their
    engine options are equal (only request knobs differ)."""

    def __init__(self, cls: Any, options: dict[str, Any], voice: str) -> None:
        self.cls, self.voice = cls, voice
        self.engine: Any = cls(msgspec.convert(options, cls.Options))
        # The same seed before each load: a checkpoint that leaves weights to their random
        # initialisation (the tiny fixtures do) loads them equal for both paths.
        torch.manual_seed(0)
        self.engine.load(lambda *a: None, lambda: False)
        self.recorder = Recorder()
        self.recorder.install(self.engine._model)

    def speak(self, text: str, options: dict[str, Any]) -> dict[str, Any]:
        """One request, timed: its audio, ``done.facts``, codes, mels and what the calls saw."""
        request = SynthesisRequest(
            id=0, text=text, voice=self.voice, emotion=None, options=msgspec.convert(options, self.cls.RequestOptions)
        )
        self.recorder.take()
        started = time.perf_counter()
        pieces = list(self.engine.synthesize(request, lambda *a: None, lambda: False))
        wall = time.perf_counter() - started
        codes, mels, calls = self.recorder.take()
        audio = np.concatenate(pieces) if pieces else np.zeros(0, np.int16)
        facts = self.engine.request_facts()
        return {"wall": wall, "audio": audio, "facts": facts, "codes": codes, "mels": mels, "calls": calls}

    def unload(self) -> dict[str, Any]:
        info: dict[str, Any] = self.engine.info()
        self.engine.unload()
        return info


class Path:
    """What one side (baseline or candidate) measured: per round its wall time, per stage its
    seconds, the first round's outputs, and what its model calls saw."""

    def __init__(self, requests: list[dict[str, Any]]) -> None:
        self.requests = requests
        self.rounds: list[float] = []
        self.stages: dict[str, float] = {}
        self.outputs: list[dict[str, Any]] = []
        self.calls: dict[str, list[Any]] = {}
        self.info: dict[str, Any] = {}

    def warm(self, engine: Engine, texts: list[str]) -> None:
        """First-call costs (allocations, the voice's conditioning, a knob's first shapes) out of the timing."""
        engine.speak(texts[0], self.requests[0])

    def run(self, engine: Engine, texts: list[str], i: int, round_: int) -> None:
        out = engine.speak(texts[i], self.requests[i])
        if len(self.rounds) <= round_:
            self.rounds.append(0.0)
        self.rounds[round_] += out["wall"]
        for name, seconds in (out["facts"].get("stages") or {}).items():
            self.stages[name] = self.stages.get(name, 0.0) + float(seconds)
        for name, seen in out["calls"].items():
            self.calls.setdefault(name, []).extend(seen)
        if round_ == 0:
            self.outputs.append(out)


def measure(
    cls: Any, options: tuple[dict[str, Any], dict[str, Any]], paths: tuple[Path, Path], texts: list[str], args: Any
) -> bool:
    """Run both paths; True when interleaved.

    With equal engine options one engine serves both, and with ``--hold-both`` two are held:
    then every text runs on both paths back to back, in an order that alternates round by
    round, so that the machine's drift falls on both alike.  Otherwise (an engine knob, one
    engine at a time) the baseline runs all its rounds, is unloaded, then the candidate."""
    voice = args.voice or os.path.join(args.model_dir, "voice.wav")
    shared = options[0] == options[1]
    if shared or args.hold_both:
        engines = (Engine(cls, options[0], voice),) * 2 if shared else tuple(Engine(cls, o, voice) for o in options)
        for path, engine in zip(paths, engines, strict=True):
            path.warm(engine, texts)
        for round_ in range(args.rounds):
            order = (0, 1) if round_ % 2 == 0 else (1, 0)
            for i in range(len(texts)):
                for side in order:
                    paths[side].run(engines[side], texts, i, round_)
        infos = {id(engine): engine.unload() for engine in dict.fromkeys(engines)}
        for path, engine in zip(paths, engines, strict=True):
            path.info = infos[id(engine)]
        return True
    for path, engine_options in zip(paths, options, strict=True):
        print(f"{'baseline' if path is paths[0] else 'candidate'}: engine {engine_options}", file=sys.stderr)
        engine = Engine(cls, engine_options, voice)
        path.warm(engine, texts)
        for round_ in range(args.rounds):
            for i in range(len(texts)):
                path.run(engine, texts, i, round_)
        path.info = engine.unload()
    return False


def token_match(base: list[list[int]], cand: list[list[int]]) -> tuple[int, int]:
    """(tokens decoded identically, tokens counted) over segments taken pairwise."""
    same = total = 0
    for i in range(max(len(base), len(cand))):
        a = base[i] if i < len(base) else []
        b = cand[i] if i < len(cand) else []
        same += sum(1 for x, y in zip(a, b, strict=False) if x == y)
        total += max(len(a), len(b))
    return same, total


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    frames = min(a.shape[-1], b.shape[-1])
    x, y = a[..., :frames].astype(np.float64).ravel(), b[..., :frames].astype(np.float64).ravel()
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(np.dot(x, y) / norm) if norm else (1.0 if not x.any() and not y.any() else 0.0)


def snr_db(base: np.ndarray, cand: np.ndarray) -> float:
    n = min(base.size, cand.size)
    a, b = base[:n].astype(np.float64), cand[:n].astype(np.float64)
    noise = float(np.sum((a - b) ** 2))
    signal = float(np.sum(a**2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal else -math.inf


def parse_knobs(pairs: list[str]) -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in (*REQUEST_KNOBS, *ENGINE_KNOBS):
            raise SystemExit(f"--knob {pair!r}: expected NAME=VALUE with NAME in {REQUEST_KNOBS + ENGINE_KNOBS}")
        knobs[name] = json.loads(value)
    return knobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("version", choices=("2", "2.5"))
    parser.add_argument("model_dir")
    parser.add_argument("--profile", choices=("default", "fast"), default=None)
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--texts", nargs="+", default=list(TEXTS))
    parser.add_argument("--voice", default=None, help="reference clip (default: MODEL_DIR/voice.wav)")
    parser.add_argument("--tokens", type=int, default=20, help="max_mel_tokens of each request")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--require", action="append", default=[], metavar="GATE=MIN")
    parser.add_argument(
        "--hold-both",
        action="store_true",
        help="with an engine knob, hold both engines loaded and interleave (twice the memory)",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    knobs = parse_knobs(args.knob)
    requires = {}
    for pair in args.require:
        name, _, value = pair.partition("=")
        if name not in GATES:
            raise SystemExit(f"--require {pair!r}: GATE is one of {GATES}")
        requires[name] = float(value)
    cls = IndexTTS2Engine if args.version == "2" else IndexTTS25Engine
    engine_options: dict[str, Any] = {"model_dir": args.model_dir, "device": args.device, "use_qwen_emo": False}
    base = [
        {"do_sample": False, "seed": 7 + i, "max_mel_tokens": args.tokens, "num_beams": UPSTREAM_BEAMS}
        for i in range(len(args.texts))
    ]
    cand_request = {name: value for name, value in knobs.items() if name in REQUEST_KNOBS}
    if args.profile is not None:
        cand_request["profile"] = args.profile
    candidate = []
    for options in base:
        options = dict(options)
        if args.profile == "fast" and "num_beams" not in knobs:
            del options["num_beams"]  # the profile's
        candidate.append({**options, **cand_request})
    cand_engine = {**engine_options, **{k: v for k, v in knobs.items() if k in ENGINE_KNOBS}}
    if args.profile == "fast":
        cand_engine["profile"] = "fast"  # its bf16_weights, where the device has them
    print(f"baseline: upstream's path, {UPSTREAM_BEAMS} beams, greedy; candidate: {cand_request}", file=sys.stderr)
    baseline, cand = Path(base), Path(candidate)
    interleaved = measure(cls, (engine_options, cand_engine), (baseline, cand), args.texts, args)
    ratios = [b / c for b, c in zip(baseline.rounds, cand.rounds, strict=True) if c]

    inputs = []
    same = total = 0
    cosines: list[float] = []
    snrs: list[float] = []
    for text, b, c in zip(args.texts, baseline.outputs, cand.outputs, strict=True):
        s, t = token_match(b["codes"], c["codes"])
        same, total = same + s, total + t
        mel = [cosine(x, y) for x, y in zip(b["mels"], c["mels"], strict=False)]  # segments both have
        snr = snr_db(b["audio"], c["audio"])
        cosines += mel
        snrs.append(snr)
        inputs.append(
            {
                "text": text,
                "token_match": s / t if t else 1.0,
                "tokens": [len(x) for x in b["codes"]],
                "candidate_tokens": [len(x) for x in c["codes"]],
                "mel_cosine": mel,
                "snr_db": snr,
                "samples": int(b["audio"].size),
                "candidate_samples": int(c["audio"].size),
            }
        )
    gates = {
        "token_match": same / total if total else 1.0,
        "mel_cosine": min(cosines) if cosines else 1.0,
        "mel_cosine_mean": float(np.mean(cosines)) if cosines else 1.0,
        "snr_db": min(snrs) if snrs else math.inf,
        "snr_db_mean": float(np.mean(snrs)) if snrs else math.inf,
        "speedup": sum(baseline.rounds) / sum(cand.rounds) if sum(cand.rounds) else math.inf,
    }
    failed = [name for name, minimum in requires.items() if not gates[name] >= minimum]
    report = {
        "version": args.version,
        "model_dir": os.path.basename(os.path.normpath(args.model_dir)),
        "device": args.device,
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "tokens": args.tokens,
        "profile": args.profile,
        "knobs": knobs,
        "gates": gates,
        "required": requires,
        "failed": failed,
        "interleaved": interleaved,
        "speedup_rounds": ratios,
        "wall_s": {"baseline": sum(baseline.rounds), "candidate": sum(cand.rounds)},
        "wall_rounds_s": {"baseline": baseline.rounds, "candidate": cand.rounds},
        "stages_s": {"baseline": baseline.stages, "candidate": cand.stages},
        "calls": {"baseline": baseline.calls, "candidate": cand.calls},
        "facts": [out["facts"] for out in cand.outputs],
        "engine": {"baseline": baseline.info, "candidate": cand.info},
        "inputs": inputs,
    }
    print_table(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=1, default=str)
    print("ok" if not failed else f"failed: {', '.join(failed)}")
    return 1 if failed else 0


def print_table(report: dict[str, Any]) -> None:
    gates = report["gates"]
    rows: list[tuple[str, Callable[[Any], str], Any]] = [
        ("token match", "{:.3f}".format, gates["token_match"]),
        ("mel cosine (min)", "{:.4f}".format, gates["mel_cosine"]),
        ("mel cosine (mean)", "{:.4f}".format, gates["mel_cosine_mean"]),
        ("vocoder SNR dB (min)", "{:.1f}".format, gates["snr_db"]),
        ("vocoder SNR dB (mean)", "{:.1f}".format, gates["snr_db_mean"]),
        ("speed-up", "{:.2f}x".format, gates["speedup"]),
    ]
    ratios = report["speedup_rounds"]
    if len(ratios) > 1:
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} rounds"
        rows.append(("  its rounds", str, spread + (", interleaved" if report["interleaved"] else "")))
    print(f"IndexTTS-{report['version']} profile={report['profile']} knobs={report['knobs']}")
    for label, fmt, value in rows:
        print(f"  {label:<24}{fmt(value)}")
    stages = report["stages_s"]
    for name in sorted(set(stages["baseline"]) | set(stages["candidate"])):
        b, c = stages["baseline"].get(name, 0.0), stages["candidate"].get(name, 0.0)
        print(f"  {name:<24}{b:8.2f} s -> {c:8.2f} s")


if __name__ == "__main__":
    raise SystemExit(main())
