"""IndexTTS-2 and 2.5 at their published sizes, through the public client, on the real upstream code.

The checkpoints are random weights at the published dimensions, built by the conformance
suite's builder (``tests/upstream/fixture.py`` kinds ``2-full`` and ``2.5-full``; ``--small``
takes its tiny kinds ``2`` and ``2.5``): the same compute per token as the real models, but
they never choose the stop token, so every request is given a fixed token budget
(``max_mel_tokens``) equal to natural speech for its text, and runs to it.  Nothing is
downloaded; upstream is the GitHub checkout on ``PYTHONPATH``, never a copy::

    INDEXTTS_UPSTREAM_PYTHON=$(python3 tests/upstream/build_venv.py github) \\
        .venv/bin/python bench/bench_gpu.py --small --device cpu --out bench_gpu.json
    # on a GPU machine (bench/gpu_run.sh sets it up): python3 bench/bench_gpu.py --device cuda:0

Cells (each one ends up in the JSON file, measured or skipped with the reason):

* ``floor``: what this device allows each stage, measured in the same run, before any sidecar
  starts (``bench/_floor.py`` in upstream's venv, its docstring says how): memory-read bandwidth
  and fp32 matmul throughput with the threads torch uses, then one request of the medium text
  counted: the GPT's floor per decoding step (the bytes a step reads, decoder weights and KV
  cache, over the bandwidth), s2mel's and BigVGAN's (their matmul and convolution FLOPs,
  counted from the shapes by torch's ``FlopCounterMode``, over the matmul throughput).  The
  top-level ``floor`` section holds per model ``gpt_step_s`` (at upstream's default three
  beams, as the throughput cell decodes), ``s2mel_s``, ``vocoder_s``, and
  ``measured_over_floor`` per stage from the throughput cell's medium text (fp32).
* ``throughput``: seconds of audio per second of wall time for a short, a medium and a long
  text, per model, precision (fp32, and upstream's fp16 for 2 / bf16 for 2.5) and
  ``use_accel``; with upstream's own printed stage times (GPT, s2mel, BigVGAN), read from
  the sidecar's stderr, and, with the floor cell, each stage's time over its floor
  (``over_floor``: the GPT's seconds per token for every text, s2mel and BigVGAN for the
  medium text, whose FLOPs the floor counted).  The variants of one model run side by side, interleaved round
  after round.
* ``stream``: the long text in several segments: when the first chunk arrives, streamed
  (``Client.stream``: the engine's default for a stream, its first segment cut at 10 text tokens;
  ``--first-segment-tokens`` sets another length, 0 upstream's segments), against when the whole
  audio is there (``synthesize``, upstream's segments).  Both requests run on a sidecar of its own
  with natural stops (``bench/_natural_stop.py``, its docstring says how): each GPT call, one a
  segment, is capped at its segment text's natural length at ``--scale`` (at least 1 token; the
  request's ``max_mel_tokens`` is the whole text's budget), as a real model would stop, so a short first segment
  speaks a few words' worth, not a sentence's; ``natural_stop``, ``segment_caps_streamed`` and
  ``segment_caps_whole`` in the cell say so.  ``--no-natural-stop``: every segment runs to the
  request's ``max_mel_tokens`` (the random weights never choose the stop token), on the default
  sidecar.
* ``voice_cache``: three voices in turn, the adapter's caches (``voice_cache=4`` and the voice
  prefix cache, ``prefix_cache=8``) against none (``voice_cache=0``, ``prefix_cache=0``): wall
  time per request, and the GPT's prefill as the adapter reports it (``done.facts``:
  ``prefix_cache.prefill_s``, the emotion vector, the conditioning and the first forward pass)
  of each voice's first request (the first round) against its later ones (later rounds, and one
  more request of the first voice after them, so that one round has a second request too).
* ``sidecars``: 1, 2 and 4 sidecars of one model on one device, all busy at once: aggregate
  audio seconds per second and the memory of each sidecar (torch's allocator as the
  sidecar's health answer reports it, and ``nvidia-smi``'s per-process figure on a GPU).

* ``batch``: c = 1, 2, 4, 8 (``--concurrency``) concurrent requests (the medium text, greedy, a
  seed each, streamed in upstream's one segment: ``first_segment_tokens=0``) into one sidecar that
  batches (``max_batch`` = the largest c, ``--batch-wait-ms 100``, so that requests sent together
  form one batch), against the same requests into one sidecar that does not (``max_batch=1``: c =
  1 is the lone request; ``--unbatched-at 1`` runs it at c = 1 only, as its c requests run one
  after another anyway), and against c sidecars (up to the largest ``--sidecars``; c = 1 is the
  unbatched sidecar's lone request); the cell's ``batch_stages`` says which stages the batching
  sidecar ran batched (its ``done`` facts; ``--batch-stages`` sets the engine option). Every
  sidecar runs the measured request once, untimed, before any round is timed; each round runs
  every c and every configuration at it, alternating their order. Each round records its wall
  time, audio, first audio (median and earliest request), upstream's stage times (median over its
  requests) and the peak memory of its sidecars (health pings every 0.25 s: RSS on the CPU,
  torch's reserved memory on a GPU). The top-level ``batch`` section holds ``equal_to_unbatched``
  (each request of a batch of 4 against itself alone in the same sidecar: at most one int16 step
  apart on at most 1% of the samples, see tests/upstream/test_upstream_batching.py),
  ``throughput_ratio`` (aggregate audio seconds per second at c over c = 1, batching sidecar,
  whose lone request first waits ``--batch-wait-ms``), ``throughput_ratio_over_lone`` (the same
  over the unbatched sidecar's lone request, which waits for nothing), ``first_audio_ratio``
  (median first audio at c over c = 1), ``first_audio_over_lone`` (``earliest`` and ``median``
  first audio at c over the lone request's), ``stage_throughput_ratio`` (per c and stage, ``gpt``,
  ``s2mel``, ``vocoder``: c rows in the stage's time at c against one row in the lone request's, c
  x t_1 / t_c; for the stages the sidecar batched only, ``row_by_row_stages`` naming the others,
  whose throughput is 1 by construction), ``bound`` (per c: the end-to-end throughput over the
  lone request that the lone request's stage shares and ``stage_throughput_ratio`` allow, the rest
  of its time paid per request; :func:`stage_bound`) and ``over_bound``
  (``throughput_ratio_over_lone`` over it), ``memory_per_extra_row`` (peak memory at c less at c =
  1, over c - 1), the same throughput against the other two configurations, and memory per
  configuration.
* ``overhead``: the same request through the public client and through upstream's
  ``IndexTTS2.infer`` called directly in one process (``bench/_upstream_direct.py``) on the same
  device, interleaved: our wall time over upstream's, median and spread.
* ``mps``: c sidecars (each count of 2 or more in ``--sidecars``) of one model on one GPU
  under a pool's private NVIDIA MPS daemon (``Pool(devices=[device], per_device=c, mps=True)``)
  against c sidecars that time-slice it, the batch cell's requests, interleaved round by round:
  whether each member attached to the daemon (``attached``), aggregate audio seconds per second
  of each, their ratio per round (``mps_over_time_slicing``) and ``nvidia-smi``'s memory per
  member.  Skipped, with the pool's reason, where MPS cannot run (no NVIDIA driver).

On the CPU the sidecars start as the cells need them, and after each cell every sidecar but
the default variant's first is closed again: a full-size sidecar holds about 9 GB there, so at
most two are loaded at once (the default and the cell's own: no voice cache, batching, or
upstream's process in ``overhead``). At full size on a 2-core CPU, leave out ``sidecars`` and
``mps`` (``--cells``) and pass ``--sidecars 1``.

Writes the JSON file after every cell (a run stopped half-way keeps what it measured) and
prints a table at the end.  ``--budget`` seconds after the start, cells not yet begun are
recorded as skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import anyio
import numpy as np
from _natural_stop import ENV as NATURAL_STOP_ENV
from _natural_stop import LINE_RE as NATURAL_STOP_RE
from _upstream_env import upstream_env

from indextts_client import Client, MpsUnavailableError, Pool, ProgressEvent, SidecarError
from indextts_sidecar.engines.indextts._options import PREFIX_CACHE_DEFAULT
from indextts_sidecar.engines.indextts._segments import STREAM_FIRST_SEGMENT_TOKENS

ROOT = Path(__file__).resolve().parent.parent

#: Natural English read speech: about 150 words a minute, which is about 14 characters a second
#: counting spaces and punctuation.  The token budget of a text is its length at this rate.
CHARS_PER_SECOND = 14.0
#: GPT tokens per second of audio.  IndexTTS-2: s2mel stretches each token to 1.72 mel frames of
#: 256 samples at 22050 Hz (infer_v2.py), 50.1 tokens a second; IndexTTS-2.5's codec decodes each
#: token to two such steps (EnhancedCodec's downsample_scale=2, infer_v2_5.py), 25.0 a second.
TOKENS_PER_SECOND = {"2": 22050 / 256 / 1.72, "2.5": 22050 / 256 / 1.72 / 2}
#: Lengths after upstream's README speed table (7, 16, 28, 80, 200 characters): 16, 80, 200.
TEXTS = {
    "short": "Hello, everyone.",
    "medium": "The quick brown fox jumps over the lazy dog, and then it runs back to the woods.",
    "long": (
        "Speech synthesis has come a long way. Modern systems clone a voice from a few seconds of "
        "audio, and they can speak with feeling. Still, the time they take matters to those who "
        "wait for the first word."
    ),
}
#: The long text in segments of at most this many text tokens, for the streaming cell: with the
#: fixtures' tokenizers, about one sentence each (three with IndexTTS-2's, four with 2.5's).
STREAM_SEGMENT_TOKENS = 60
#: The text the floor cell counts FLOPs on (the batch and overhead cells' text too).
FLOOR_TEXT = "medium"
#: Upstream's default beams (its generation config): the rows of a throughput request's GPT step.
UPSTREAM_BEAMS = 3
#: The precision upstream offers besides fp32, per model, and the engine option that turns it on.
HALF = {"2": "fp16", "2.5": "bf16"}
ENGINES = {"2": "indextts2", "2.5": "indextts2.5"}
#: The voice_cache cell's other sidecar: neither the voice cache nor the voice prefix cache.
NO_CACHES: dict[str, Any] = {"voice_cache": 0, "prefix_cache": 0}
STAGE_RE = re.compile(r">> (gpt_gen_time|gpt_forward_time|s2mel_time|bigvgan_time|Total inference time): ([0-9.]+)")
STAGE_NAMES = {
    "gpt_gen_time": "gpt",
    "gpt_forward_time": "gpt_forward",
    "s2mel_time": "s2mel",
    "bigvgan_time": "vocoder",
    "Total inference time": "total",
}
SEGMENTS_RE = re.compile(r"^(\d+) segments?, ")
#: Bounds: a request (full size, fp32, on a GPU: seconds; tiny on a busy CPU: a minute), a load,
#: and the wait for upstream's timing lines after a request's last frame.
REQUEST_TIMEOUT = 600.0
LOAD_TIMEOUT = 900.0
STAGE_LINES_TIMEOUT = 60.0


def natural_seconds(text: str) -> float:
    return len(text) / CHARS_PER_SECOND


#: The fraction of natural speech each budget asks for: 1 at full size; ``--small`` takes 0.1 (a
#: tiny model on a CPU takes about 50 ms a token, and the test must finish in minutes).
SCALE = [1.0]


def budget(model: str, seconds: float) -> int:
    return max(1, round(seconds * SCALE[0] * TOKENS_PER_SECOND[model]))


def tokens_per_char(model: str) -> float:
    """:func:`budget` per character of text: bench/_natural_stop.py's rate for a segment's text."""
    return SCALE[0] * TOKENS_PER_SECOND[model] / CHARS_PER_SECOND


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# ------------------------------------------------------------------ stage times from stderr


class StageLog(logging.Handler):
    """Upstream's printed timings per sidecar pid, from the ``indextts_client.sidecar`` logger.

    The client forwards each stderr line of a sidecar (upstream prints to stdout, which the
    sidecar moves to stderr) from its event loop; a request's block ends with "Total
    inference time", so ``wait(pid, n)`` returns once ``n`` blocks of that sidecar are in.
    The GPT caps bench/_natural_stop.py prints (one line a segment, before that line) go with
    their request's block: ``caps[pid][n]``, empty for a sidecar without natural stops.
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.blocks: dict[int, list[dict[str, float]]] = defaultdict(list)
        self.caps: dict[int, list[list[int]]] = defaultdict(list)
        self._current: dict[int, dict[str, float]] = defaultdict(dict)
        self._current_caps: dict[int, list[int]] = defaultdict(list)
        self._waiters: dict[int, list[anyio.Event]] = defaultdict(list)

    def emit(self, record: logging.LogRecord) -> None:
        pid = getattr(record, "sidecar_pid", None)
        if pid is None:
            return
        message = record.getMessage()
        cap = NATURAL_STOP_RE.search(message)
        if cap is not None:
            self._current_caps[pid].append(int(cap.group(1)))
            return
        match = STAGE_RE.search(message)
        if match is None:
            return
        name = STAGE_NAMES[match.group(1)]
        self._current[pid][name] = float(match.group(2))
        if name == "total":
            self.blocks[pid].append(self._current.pop(pid))
            self.caps[pid].append(self._current_caps.pop(pid, []))
            for event in self._waiters.pop(pid, []):
                event.set()

    async def wait(self, pid: int, count: int) -> list[dict[str, float]]:
        with anyio.fail_after(STAGE_LINES_TIMEOUT):
            while len(self.blocks[pid]) < count:
                event = anyio.Event()
                self._waiters[pid].append(event)
                await event.wait()
        return self.blocks[pid]


@contextmanager
def stage_log() -> Iterator[StageLog]:
    handler = StageLog()
    logger = logging.getLogger("indextts_client.sidecar")
    old_level, old_propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False  # upstream's chatter stays out of this script's output
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


# ------------------------------------------------------------------ sidecars


@dataclass
class Setup:
    python: str
    src: str
    device: str
    ckpts: dict[str, Path]
    stages: StageLog


@dataclass
class Sidecar:
    """One started sidecar and what was asked of it."""

    client: Client
    model: str
    stages: StageLog
    requests: int = 0
    load_seconds: float = 0.0

    @property
    def pid(self) -> int:
        pid = self.client.pid
        assert pid is not None
        return pid

    async def speak(self, text: str, voice: str, tokens: int, **options: Any) -> dict[str, Any]:
        """One whole request: wall seconds, audio seconds, and upstream's stage times."""
        started = time.perf_counter()
        audio = await self.client.synthesize(
            text, voice=voice, max_mel_tokens=tokens, timeout=REQUEST_TIMEOUT, **options
        )
        wall = time.perf_counter() - started
        prefill = dict(audio.facts).get("prefix_cache", {}).get("prefill_s")
        stages = await self.stage_times()
        return {"wall": wall, "audio": audio.duration, "prefill": prefill, **stages, "caps": self.caps()}

    async def stream(self, text: str, voice: str, tokens: int, **options: Any) -> dict[str, Any]:
        """One streamed request: first chunk and end, in wall seconds, and the segment count."""
        segments: list[int] = []

        def progress(event: ProgressEvent) -> None:
            match = SEGMENTS_RE.match(event.message)
            if match:
                segments.append(int(match.group(1)))

        started = time.perf_counter()
        first = None
        audio = 0.0
        async with self.client.stream(
            text, voice=voice, max_mel_tokens=tokens, on_progress=progress, timeout=REQUEST_TIMEOUT, **options
        ) as chunks:
            async for chunk in chunks:
                if first is None:
                    first = time.perf_counter() - started
                audio += len(chunk.samples) / chunk.sample_rate
        wall = time.perf_counter() - started
        if first is None or not segments:
            raise RuntimeError("the stream ended without audio or without its segment count")
        result = {"wall": wall, "first": first, "audio": audio, "segments": segments[-1]}
        return {**result, **await self.stage_times(), "caps": self.caps()}

    async def stage_times(self) -> dict[str, float]:
        self.requests += 1
        blocks = await self.stages.wait(self.pid, self.requests)
        return blocks[self.requests - 1]

    def caps(self) -> list[int]:
        """The GPT caps bench/_natural_stop.py set in the last request (after :meth:`stage_times`)."""
        return self.stages.caps[self.pid][self.requests - 1]

    async def memory(self) -> dict[str, int]:
        health = await self.client.ping(timeout=30)
        return {key: int(value) for key, value in health.memory.items()}


def client_options(setup: Setup, model: str, device: str, **engine_options: Any) -> dict[str, Any]:
    """The keyword arguments of a ``Client`` (or each member of a ``Pool``) of ``model``."""
    options: dict[str, Any] = {"model_dir": str(setup.ckpts[model]), "device": device, "use_qwen_emo": False}
    options.update(engine_options)
    return {
        "python": setup.python,
        "engine_options": options,
        "env": {
            "PYTHONPATH": os.pathsep.join([str(ROOT), setup.src, *filter(None, [os.environ.get("PYTHONPATH")])]),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",  # upstream's timing lines arrive as they are printed
        },
        "ready_timeout": 120,
        "idle_timeout": LOAD_TIMEOUT,
        "max_restarts": 0,
    }


async def start(
    stack: AsyncExitStack,
    setup: Setup,
    model: str,
    sidecar_args: tuple[str, ...] = (),
    natural_stop: bool = False,
    **engine_options: Any,
) -> Sidecar:
    options = client_options(setup, model, setup.device, **engine_options)
    if natural_stop:
        # bench/_natural_stop.py in upstream's venv: the GPT stops at each segment's natural length.
        options["command"] = [options.pop("python"), str(ROOT / "bench" / "_natural_stop.py")]
        options["env"][NATURAL_STOP_ENV] = repr(tokens_per_char(model))
    client = Client(ENGINES[model], sidecar_args=sidecar_args, **options)
    sidecar = Sidecar(await stack.enter_async_context(client), model, setup.stages)
    started = time.perf_counter()
    with anyio.fail_after(LOAD_TIMEOUT):
        await client.load()
    sidecar.load_seconds = time.perf_counter() - started
    return sidecar


async def warm_up(sidecar: Sidecar, voice: str) -> None:
    """Upstream's first request is much slower than the rest (allocations, kernels, caches).

    Every cell but ``voice_cache`` then speaks with this voice, whose conditioning the adapter
    keeps: they measure the steady state; the three other clips stay cold for ``voice_cache``.
    """
    await sidecar.speak(TEXTS["short"], voice, budget(sidecar.model, natural_seconds(TEXTS["short"])))


# ------------------------------------------------------------------ the run


class Run:
    def __init__(self, args: argparse.Namespace, setup: Setup, out: Path) -> None:
        self.args = args
        self.setup = setup
        self.out = out
        self.started = time.monotonic()
        self.result: dict[str, Any] = {"config": self._config(), "cells": []}
        #: The current model's sidecars by (model, index, engine options), those that did not start,
        #: and the stack that closes them.
        self.shared: dict[tuple[Any, ...], Sidecar] = {}
        self.failed: dict[tuple[Any, ...], BaseException] = {}
        self.stack = AsyncExitStack()
        #: Each shared sidecar's own stack, so that one can be closed before the model's others.
        self.closers: dict[tuple[Any, ...], AsyncExitStack] = {}
        #: The floor cell's answer per model (bench/_floor.py).
        self.floors: dict[str, dict[str, Any]] = {}

    def _config(self) -> dict[str, Any]:
        args = self.args
        return {
            "size": "small" if args.small else "full",
            "device": args.device,
            "gpu": gpu_name() if args.device.startswith("cuda") else None,
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "upstream": upstream_commit(self.setup.src),
            "models": args.models,
            "rounds": args.rounds,
            "sidecars": args.sidecars,
            "chars_per_second": CHARS_PER_SECOND,
            "scale": SCALE[0],
            "tokens_per_second": TOKENS_PER_SECOND,
            "texts": {
                name: {"chars": len(text), "natural_seconds": natural_seconds(text)} for name, text in TEXTS.items()
            },
            "weights": "random (same compute per token, different stop behaviour)",
            "command": " ".join(sys.argv),
        }

    def over_budget(self) -> bool:
        return self.args.budget is not None and time.monotonic() - self.started > self.args.budget

    def add(self, cell: dict[str, Any]) -> None:
        self.result["cells"].append(cell)
        self.save()
        status = cell["status"] if cell["status"] == "ok" else f"{cell['status']}: {cell.get('reason', '')}"
        keys = ("kind", "model", "precision", "accel", "text", "sidecars", "voice_cache")
        label = " ".join(f"{key}={cell[key]}" for key in keys if key in cell)
        print(f"[{time.monotonic() - self.started:6.0f} s] {label}: {status}", file=sys.stderr, flush=True)

    def skip(self, cell: dict[str, Any], reason: str, status: str = "skipped") -> None:
        self.add({**cell, "status": status, "reason": reason})

    def save(self) -> None:
        partial = self.out.with_name(self.out.name + ".partial")
        partial.write_text(json.dumps(self.result, indent=1, sort_keys=True) + "\n")
        os.replace(partial, self.out)

    # ---------------------------------------------------------- cells

    def variants(self, model: str) -> list[tuple[str, bool, Union[str, None]]]:
        """(precision, use_accel, reason to skip or None) for each variant asked for."""
        cpu = self.args.device == "cpu"
        out: list[tuple[str, bool, Union[str, None]]] = []
        for precision in ("fp32", HALF[model]):
            if precision not in self.args.precisions and not (precision != "fp32" and "half" in self.args.precisions):
                continue
            for accel in self.args.accel:
                reason = None
                if cpu and precision != "fp32":
                    reason = (
                        f"upstream turns {precision} off on the CPU (infer_v2{'_5' if model == '2.5' else ''}.py: "
                        f"use_{precision} = False if device == 'cpu'): the cell would measure fp32 again"
                    )
                elif cpu and accel:
                    reason = (
                        "upstream's accel engine needs CUDA: UnifiedVoice builds it only when "
                        "torch.cuda.is_available(), with flash_attn (gpt/model_v2.py)"
                    )
                out.append((precision, accel, reason))
        return out

    def default_variant(self, model: str) -> dict[str, Any]:
        """What the stream, cache and sidecar cells use: upstream's README headline precision on a GPU."""
        if self.args.device == "cpu":
            return {}
        return {HALF[model]: True}

    async def model(self, model: str) -> None:
        voices = [str(self.setup.ckpts[model] / name) for name in ("voice.wav", "voice2.wav", "voice3.wav")]
        warm = str(self.setup.ckpts[model] / "warmup.wav")
        self.shared = {}
        self.failed = {}
        # Every sidecar the cells will use starts first, --parallel-loads at a time (a full-size
        # load is tens of seconds of CPU); the default variant's serve every cell, warmed up once.
        if "floor" in self.args.cells:
            # Before any sidecar starts: its own process loads the model once more.
            try:
                await self.floor(model, warm)
            except (TimeoutError, RuntimeError, OSError, ValueError, KeyError) as exc:
                self.skip({"kind": "floor", "model": model}, f"the cell broke off: {first_line(exc)}", status="failed")
        async with AsyncExitStack() as stack:
            self.stack = stack
            if not self.over_budget() and self.args.device != "cpu":
                # On the CPU each cell starts what it needs and release() closes it after: every
                # wanted sidecar at once would not fit in memory at full size.
                await self.prestart(model, warm)
            for kind, cell in (
                ("throughput", self.throughput),
                ("stream", self.stream),
                ("voice_cache", self.voice_cache),
                ("sidecars", self.sidecars),
                ("batch", self.batch),
                ("overhead", self.overhead),
                ("mps", self.mps),
            ):
                if kind not in self.args.cells:
                    continue
                try:
                    await cell(stack, model, voices, warm)
                except (SidecarError, TimeoutError, RuntimeError) as exc:
                    # One broken cell must not cost the rest of a one-shot GPU run.
                    self.skip({"kind": kind, "model": model}, f"the cell broke off: {first_line(exc)}", status="failed")
                await self.release(model)

    def wanted(self, model: str) -> list[tuple[int, dict[str, Any]]]:
        """Every sidecar the cells asked for will use: (index, engine options)."""
        cells = self.args.cells
        keys: list[tuple[int, dict[str, Any]]] = []
        if "throughput" in cells:
            keys += [(0, engine_options(p, a)) for p, a, reason in self.variants(model) if reason is None]
        default = self.default_variant(model)
        if {"stream", "voice_cache", "sidecars", "batch", "overhead", "mps"} & set(cells):
            keys.append((0, default))
        if "voice_cache" in cells:
            keys.append((0, {**default, **NO_CACHES}))
        if {"sidecars", "mps"} & set(cells):
            keys += [(index, default) for index in range(1, max(self.args.sidecars))]
        unique: list[tuple[int, dict[str, Any]]] = []
        for key in keys:
            if key not in unique:
                unique.append(key)
        return unique

    async def prestart(self, model: str, warm: str) -> None:
        limiter = anyio.CapacityLimiter(self.args.parallel_loads)

        async def one(index: int, options: dict[str, Any]) -> None:
            async with limiter:
                try:
                    await self.sidecar(model, warm, index, **options)
                except (SidecarError, TimeoutError, RuntimeError) as exc:
                    self.failed[(model, index, tuple(sorted(options.items())))] = exc

        async with anyio.create_task_group() as group:
            for index, options in self.wanted(model):
                group.start_soon(one, index, options)

    async def sidecar(
        self,
        model: str,
        warm: str,
        index: int = 0,
        sidecar_args: tuple[str, ...] = (),
        natural_stop: bool = False,
        **options: Any,
    ) -> Sidecar:
        """The ``index``-th warmed-up sidecar of ``model`` with these engine options, started once
        (``natural_stop``: under bench/_natural_stop.py, a sidecar of its own)."""
        key = (model, index, tuple(sorted(options.items())), *sidecar_args, *(["natural-stop"] if natural_stop else []))
        if key in self.failed:
            raise self.failed[key]
        if key not in self.shared:
            own = AsyncExitStack()
            self.stack.push_async_callback(own.aclose)
            sidecar = await start(own, self.setup, model, sidecar_args, natural_stop, **options)
            await warm_up(sidecar, warm)
            self.shared[key] = sidecar
            self.closers[key] = own
        return self.shared[key]

    async def release(self, model: str) -> None:
        """On the CPU, close every sidecar of ``model`` but the default variant's first.

        A full-size sidecar holds about 9 GB on the CPU: the default one serves every cell, and
        any other (no voice cache, batching, the upstream process of ``overhead``) lives for its
        cell only, so that at most two are loaded at once and a run of both models fits 24 GB.
        A later cell that needs a released sidecar starts (and warms) it again.
        """
        if self.args.device != "cpu":
            return
        keep = (model, 0, tuple(sorted(self.default_variant(model).items())))
        for key in [key for key in self.shared if key != keep]:
            del self.shared[key]
            await self.closers.pop(key).aclose()

    async def throughput(self, stack: AsyncExitStack, model: str, voices: list[str], warm: str) -> None:
        if "throughput" not in self.args.cells:
            return
        live: list[tuple[dict[str, Any], Sidecar]] = []
        for precision, accel, reason in self.variants(model):
            cell = {"kind": "throughput", "model": model, "precision": precision, "accel": accel}
            if reason is not None:
                for text in self.args.texts:
                    self.skip({**cell, "text": text}, reason)
                continue
            if self.over_budget():
                for text in self.args.texts:
                    self.skip({**cell, "text": text}, "time budget spent")
                continue
            try:
                sidecar = await self.sidecar(model, warm, **engine_options(precision, accel))
            except (SidecarError, TimeoutError, RuntimeError) as exc:
                for text in self.args.texts:
                    self.skip({**cell, "text": text}, f"did not load: {first_line(exc)}", status="failed")
                continue
            cell["load_seconds"] = sidecar.load_seconds
            live.append((cell, sidecar))
        if not live:
            return
        runs: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
        for number in range(self.args.rounds):
            order = live if number % 2 == 0 else live[::-1]
            for text in self.args.texts:
                tokens = budget(model, natural_seconds(TEXTS[text]))
                for index, (_cell, sidecar) in enumerate(order):
                    position = live.index(order[index])
                    runs[(position, text)].append(
                        await sidecar.speak(TEXTS[text], warm, tokens, max_text_tokens_per_segment=600)
                    )
        for position, (cell, sidecar) in enumerate(live):
            memory = await sidecar.memory()
            for text in self.args.texts:
                samples = runs[(position, text)]
                speed = [s["audio"] / s["wall"] for s in samples]
                stages = {
                    name: summary([s[name] for s in samples])
                    for name in ("gpt", "gpt_forward", "s2mel", "vocoder", "total")
                    if all(name in s for s in samples)
                }
                tokens = budget(model, natural_seconds(TEXTS[text]))
                over_floor = self.over_floor(model, text, tokens, stages)
                if over_floor is not None and text == FLOOR_TEXT and cell["precision"] == "fp32" and not cell["accel"]:
                    self.result["floor"][model]["measured_over_floor"] = over_floor
                    self.result["floor"][model]["measured"] = {"cell": "throughput", "text": text, "precision": "fp32"}
                self.add(
                    {
                        **cell,
                        "text": text,
                        "status": "ok",
                        "max_mel_tokens": tokens,
                        "over_floor": over_floor,
                        "audio_seconds": summary([s["audio"] for s in samples]),
                        "wall_seconds": summary([s["wall"] for s in samples]),
                        "audio_per_second": summary(speed),
                        "rtf": summary([1 / v for v in speed]),
                        "stages": stages,
                        "memory": memory,
                    }
                )

    async def floor(self, model: str, warm: str) -> None:
        cell: dict[str, Any] = {"kind": "floor", "model": model, "text": FLOOR_TEXT, **self.variant_label(model)}
        if self.over_budget():
            return self.skip(cell, "time budget spent")
        tokens = budget(model, natural_seconds(TEXTS[FLOOR_TEXT]))
        request = {"text": TEXTS[FLOOR_TEXT], "voice": warm, "max_mel_tokens": tokens}
        command = [self.setup.python, str(ROOT / "bench" / "_floor.py"), model, str(self.setup.ckpts[model])]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), self.setup.src]),  # bench/ is the script's own
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        with anyio.fail_after(LOAD_TIMEOUT + REQUEST_TIMEOUT):
            done = await anyio.run_process(
                [*command, self.setup.device], input=(json.dumps(request) + "\n").encode(), env=env, check=False
            )
        if done.returncode:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"bench/_floor.py exit status {done.returncode}: {tail[0][:200]}")
        figures = json.loads(done.stdout.decode().strip().splitlines()[-1])
        self.floors[model] = figures
        gpt = figures["gpt"]
        self.add({**cell, "status": "ok", "max_mel_tokens": tokens, **figures})
        self.result.setdefault("floor", {})[model] = {
            "gpt_step_s": gpt["step_s_by_rows"][str(UPSTREAM_BEAMS)],
            "gpt_step_s_by_rows": gpt["step_s_by_rows"],
            "s2mel_s": figures["s2mel"]["s"],
            "vocoder_s": figures["vocoder"]["s"],
            "bandwidth_bytes_per_s": figures["bandwidth"]["bytes_per_s"],
            "matmul_flops_per_s": figures["matmul"]["flops_per_s"],
            "threads": figures["threads"],
            "measured_over_floor": None,
            "measured": None,
        }
        self.save()

    def over_floor(self, model: str, text: str, tokens: int, stages: dict[str, Any]) -> Union[dict[str, Any], None]:
        """Each stage's median time over its floor: the GPT per token (every text), s2mel and
        BigVGAN for the text the floor counted; None without a floor."""
        floor = self.floors.get(model)
        if floor is None:
            return None
        out: dict[str, Any] = {}
        if "gpt" in stages:
            per_token = stages["gpt"]["median"] / tokens
            out["gpt"] = per_token / floor["gpt"]["step_s_by_rows"][str(UPSTREAM_BEAMS)]
        for name in ("s2mel", "vocoder"):
            if text == FLOOR_TEXT and name in stages and floor[name]["s"] > 0:
                out[name] = stages[name]["median"] / floor[name]["s"]
        return out

    async def stream(self, stack: AsyncExitStack, model: str, voices: list[str], warm: str) -> None:
        cell: dict[str, Any] = {"kind": "stream", "model": model, "text": "long", **self.variant_label(model)}
        if self.over_budget():
            return self.skip(cell, "time budget spent")
        # Random weights never stop: by default each GPT call (a segment) is capped at its text's
        # natural length (bench/_natural_stop.py, a sidecar of its own), as a real model stops.
        natural = self.args.natural_stop
        sidecar = await self.sidecar(model, warm, natural_stop=natural, **self.default_variant(model))
        text = TEXTS["long"]
        options = {"max_text_tokens_per_segment": STREAM_SEGMENT_TOKENS}
        # The stream's first segment as the engine cuts a stream's by default, or at the flag's
        # length (0: upstream's segments); the whole request (synthesize) keeps upstream's.
        flag = self.args.first_segment_tokens
        short = {} if flag is None else {"first_segment_tokens": flag}
        # The budget is per segment: count the segments with a one-token probe first.
        probe = await sidecar.stream(text, warm, 1, **options, first_segment_tokens=0)
        segments = probe["segments"]
        # Without natural stops every segment runs to its budget: the text's, shared out.  With them
        # each stops at its own text's natural length, under the whole text's budget.
        whole_budget = budget(model, natural_seconds(text))
        tokens = whole_budget if natural else max(1, math.ceil(whole_budget / segments))
        streamed: list[dict[str, Any]] = []
        whole: list[dict[str, Any]] = []
        for number in range(self.args.rounds):
            pair = ("stream", "whole") if number % 2 == 0 else ("whole", "stream")
            for way in pair:
                if way == "stream":
                    streamed.append(await sidecar.stream(text, warm, tokens, **options, **short))
                else:
                    whole.append(await sidecar.speak(text, warm, tokens, **options))
        first = [s["first"] for s in streamed]
        caps: dict[str, Union[list[int], None]] = {}
        for name, runs in (("streamed", streamed), ("whole", whole)):
            if not runs:
                caps[name] = None
                continue
            seen = runs[0]["caps"]
            count = runs[0]["segments"] if name == "streamed" else segments
            if not natural:
                seen = [tokens] * count  # every segment runs to the request's budget
            elif len(seen) != count or any(run["caps"] != seen for run in runs):
                seen_all = [run["caps"] for run in runs]
                raise RuntimeError(f"natural stop: the {name} requests' caps {seen_all}, for {count} segments")
            caps[name] = seen
        self.add(
            {
                **cell,
                "status": "ok",
                "natural_stop": natural,
                "segment_caps_streamed": caps["streamed"],
                "segment_caps_whole": caps["whole"],
                "segments": segments,
                "first_segment_tokens": STREAM_FIRST_SEGMENT_TOKENS if flag is None else flag,
                "segments_streamed": streamed[0]["segments"] if streamed else None,
                "max_mel_tokens_per_segment": tokens,
                "audio_seconds": summary([s["audio"] for s in streamed]),
                "first_audio_streamed": summary(first),
                "end_streamed": summary([s["wall"] for s in streamed]),
                "whole": summary([s["wall"] for s in whole]),
                "first_over_whole": summary([f / w["wall"] for f, w in zip(first, whole, strict=True)]),
            }
        )

    async def voice_cache(self, stack: AsyncExitStack, model: str, voices: list[str], warm: str) -> None:
        base = {"kind": "voice_cache", "model": model, "text": "short", **self.variant_label(model)}
        if self.over_budget():
            for size in (4, 0):
                self.skip({**base, "voice_cache": size}, "time budget spent")
            return
        pair = []
        for size in (4, 0):
            # 4 is the adapter's default (VOICE_CACHE_DEFAULT): the default variant's sidecar as it is.
            extra: dict[str, Any] = NO_CACHES if size == 0 else {}
            pair.append(await self.sidecar(model, warm, **self.default_variant(model), **extra))
        tokens = budget(model, natural_seconds(TEXTS["short"]))
        times: dict[int, list[float]] = {0: [], 1: []}
        prefills: dict[int, list[float]] = {0: [], 1: []}
        for number in range(self.args.rounds):
            for voice in voices:
                order = (0, 1) if number % 2 == 0 else (1, 0)
                for index in order:
                    spoken = await pair[index].speak(TEXTS["short"], voice, tokens)
                    times[index].append(spoken["wall"])
                    prefills[index].append(spoken["prefill"])
        for index in (0, 1):  # the first voice once more: a second request even with one round
            prefills[index].append((await pair[index].speak(TEXTS["short"], voices[0], tokens))["prefill"])
        for index, size in enumerate((4, 0)):
            # The first round is cold for both: every voice is new.  One round: no later rounds.
            later = times[index][len(voices) :]
            self.add(
                {
                    **base,
                    "voice_cache": size,
                    "prefix_cache": PREFIX_CACHE_DEFAULT if size else 0,
                    "status": "ok",
                    "voices": len(voices),
                    "first_round": summary(times[index][: len(voices)]),
                    "later_rounds": summary(later) if later else None,
                    "gpt_prefill": prefill_figures(prefills[index], len(voices)),
                }
            )

    async def sidecars(self, stack: AsyncExitStack, model: str, voices: list[str], warm: str) -> None:
        tokens = budget(model, natural_seconds(TEXTS["medium"]))
        live: list[Sidecar] = []
        for count in sorted(self.args.sidecars):
            cell: dict[str, Any] = {"kind": "sidecars", "model": model, "sidecars": count, "text": "medium"}
            cell.update(self.variant_label(model))
            if self.over_budget():
                self.skip(cell, "time budget spent")
                continue
            try:
                while len(live) < count:
                    live.append(await self.sidecar(model, warm, len(live), **self.default_variant(model)))
            except (SidecarError, TimeoutError, RuntimeError) as exc:
                self.skip(cell, f"sidecar {len(live) + 1} did not start: {first_line(exc)}", status="failed")
                break
            audio: list[float] = []

            async def busy(sidecar: Sidecar, audio: list[float] = audio) -> None:
                for _round in range(self.args.rounds):
                    audio.append((await sidecar.speak(TEXTS["medium"], warm, tokens))["audio"])

            started = time.perf_counter()
            async with anyio.create_task_group() as group:
                for sidecar in live[:count]:
                    group.start_soon(busy, sidecar)
            wall = time.perf_counter() - started
            memory = [await s.memory() for s in live[:count]]
            smi = nvidia_smi_memory([s.pid for s in live[:count]]) if self.args.device.startswith("cuda") else None
            self.add(
                {
                    **cell,
                    "status": "ok",
                    "requests": len(audio),
                    "wall_seconds": wall,
                    "audio_seconds": sum(audio),
                    "aggregate_audio_per_second": sum(audio) / wall,
                    "memory": memory,
                    "nvidia_smi_mib": smi,
                }
            )

    async def batch(self, stack: AsyncExitStack, model: str, voices: list[str], warm: str) -> None:
        counts = sorted(self.args.concurrency)
        # c requests into the sidecar that does not batch run one after another: the audio per
        # second and the stage times of c = 1 are theirs, so --unbatched-at 1 saves their time.
        unbatched_at = set(self.args.unbatched_at or counts) | {1}
        cell: dict[str, Any] = {"kind": "batch", "model": model, "text": "medium", **self.variant_label(model)}
        if self.over_budget():
            return self.skip(cell, "time budget spent")
        default = self.default_variant(model)
        chosen = {"batch_stages": self.args.batch_stages} if self.args.batch_stages else {}
        batching = await self.sidecar(
            model, warm, 0, ("--batch-wait-ms", str(BATCH_WAIT_MS)), max_batch=max(counts), **default, **chosen
        )
        single = await self.sidecar(model, warm, 0, **default)
        tokens = budget(model, natural_seconds(TEXTS["medium"]))
        text = TEXTS["medium"]

        # Equal audio: each request of a batch of 4 (or fewer) against itself alone, in the same
        # sidecar (one after another, each runs by itself): the random weights of the GitHub
        # flavours' fixtures are drawn anew in each process, so two sidecars never sound alike.
        c_equal = max(c for c in counts if c <= 4)
        alone = [await collect(batching, text, warm, tokens, seed=i) for i in range(c_equal)]
        together = await concurrently([batching] * c_equal, text, warm, tokens)
        differences = [audio_difference(a["samples"], b["samples"]) for a, b in zip(alone, together, strict=True)]
        equal = all(d["max"] <= 1 and d["share"] <= 0.01 for d in differences)
        # Which stages the batching sidecar ran batched (engine option batch_stages), as its done says.
        stages_ran = sorted({str(r["facts"].get("batch_stages")) for r in together})

        many: list[Sidecar] = []
        if min(counts) <= max(self.args.sidecars):
            many = [
                await self.sidecar(model, warm, i, **default) for i in range(min(max(counts), max(self.args.sidecars)))
            ]
        # Each configuration warmed with the measured request before it is timed: the batching
        # sidecar ran it above (alone, and in a batch of c_equal), the others run it once here
        # (a sidecar's first request of this length ran several times slower than its next).
        for sidecar in [single, *(s for s in many if s is not single)]:
            await collect(sidecar, text, warm, tokens, seed=0)
            await self.round_stages([sidecar])
        configurations: dict[str, dict[int, list[dict[str, Any]]]] = {"batched": {}, "unbatched": {}, "sidecars": {}}
        # Interleaved round by round: every c and configuration once a round, the order of the
        # configurations alternating.
        for number in range(self.args.rounds):
            for position, c in enumerate(counts):
                ways: list[tuple[str, list[Sidecar]]] = [("batched", [batching] * c)]
                if c in unbatched_at:
                    ways.append(("unbatched", [single] * c))
                if 1 < c <= len(many):
                    ways.append(("sidecars", many[:c]))
                for name, sidecars in ways if (number + position) % 2 == 0 else ways[::-1]:
                    configurations[name].setdefault(c, []).append(await self.timed_round(sidecars, text, warm, tokens))
        if many:
            # One sidecar of the c is the unbatched one (index 0, the same process): c = 1 ran once.
            configurations["sidecars"][1] = configurations["unbatched"][1]
        memory = {
            "batched": await batching.memory(),
            "unbatched": await single.memory(),
            "sidecars": [await s.memory() for s in self.live_sidecars(model, default)],
        }
        figures: dict[str, Any] = {}
        for name, runs_of in configurations.items():
            figures[name] = {str(c): round_figures(runs) for c, runs in runs_of.items()}
        self.add(
            {
                **cell,
                "status": "ok",
                "max_mel_tokens": tokens,
                "batch_wait_ms": BATCH_WAIT_MS,
                "decoding": {"do_sample": False, "seed": "request index"},
                "first_segment_tokens": 0,
                "warm_up": "the measured request, untimed, in each sidecar first (in the batching one also a batch "
                f"of {c_equal}: the equality check)",
                "order": "interleaved: each round runs every c, and each configuration at it, alternating the order",
                "unbatched_at": sorted(unbatched_at),
                "equal_to_unbatched": equal,
                "batch_stages": stages_ran[0] if len(stages_ran) == 1 else stages_ran,
                "differences": differences,
                "configurations": figures,
                "memory": memory,
            }
        )
        self.batch_section(model, equal, figures, memory, stages_ran[0] if len(stages_ran) == 1 else None)

    async def round_stages(self, sidecars: list[Sidecar]) -> list[dict[str, float]]:
        """Upstream's stage times of the requests just sent to ``sidecars`` (one per entry), once printed."""
        blocks: list[dict[str, float]] = []
        for sidecar in distinct(sidecars):
            sent = sum(1 for other in sidecars if other is sidecar)
            blocks += (await self.setup.stages.wait(sidecar.pid, sidecar.requests))[-sent:]
        return blocks

    async def timed_round(self, sidecars: list[Sidecar], text: str, voice: str, tokens: int) -> dict[str, Any]:
        """One request per entry of ``sidecars``, all at once: wall, audio, first audio (median and
        earliest), upstream's stage times (median over the requests), and the peak memory of the
        sidecars together while it ran (their health answers, every MEMORY_POLL seconds)."""
        each = distinct(sidecars)
        peaks = [0] * len(each)

        async def watch() -> None:
            while True:
                for i, sidecar in enumerate(each):
                    peaks[i] = max(peaks[i], memory_in_use(await sidecar.memory()))
                await anyio.sleep(MEMORY_POLL)

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            runs = await concurrently(sidecars, text, voice, tokens)
            wall = time.perf_counter() - started
            group.cancel_scope.cancel()
        blocks = await self.round_stages(sidecars)
        return {
            "wall": wall,
            "audio": sum(r["audio"] for r in runs),
            "first": statistics.median(r["first"] for r in runs),
            "first_earliest": min(r["first"] for r in runs),
            "stages": {
                name: statistics.median(block[name] for block in blocks)
                for name in STAGES
                if all(name in block for block in blocks)
            },
            "peak_memory": sum(peaks),
        }

    async def mps(self, stack: AsyncExitStack, model: str, voices: list[str], warm: str) -> None:
        """c sidecars on one GPU under a pool's private MPS daemon (``Pool(per_device=c, mps=True)``)
        against c sidecars that time-slice it, the same requests as the batch cell's, interleaved."""
        counts = sorted(c for c in self.args.sidecars if c >= 2)
        cell: dict[str, Any] = {"kind": "mps", "model": model, "text": "medium", **self.variant_label(model)}
        cell["sidecars"] = max(counts, default=0)
        if not counts:
            return self.skip(cell, "MPS shares a GPU between sidecars: --sidecars names no count of 2 or more")
        if self.over_budget():
            return self.skip(cell, "time budget spent")
        default = self.default_variant(model)
        device = self.args.device
        options = client_options(self.setup, model, "cpu" if device == "cpu" else "cuda:0", **default)
        tokens = budget(model, natural_seconds(TEXTS["medium"]))
        text = TEXTS["medium"]
        pool = Pool(ENGINES[model], devices=[device], per_device=max(counts), mps=True, **options)
        try:
            await pool.start()
        except MpsUnavailableError as exc:  # no NVIDIA driver, or its daemon did not start
            return self.skip(cell, f"no MPS daemon: {first_line(exc)}")
        try:
            with anyio.fail_after(LOAD_TIMEOUT):
                await pool.load()  # CUDA attaches each sidecar to the daemon at its first use
            attached = await pool.mps_attached()
            shared = [Sidecar(client, model, self.setup.stages) for client in pool.members]
            slicing = [await self.sidecar(model, warm, i, **default) for i in range(max(counts))]
            # One untimed round of the measured request each: a sidecar's first greedy request of
            # this length ran several times slower than the next on the CPU here.
            await concurrently(shared, text, warm, tokens)
            await concurrently(slicing, text, warm, tokens)
            runs: dict[str, dict[int, list[dict[str, float]]]] = {"mps": {}, "time_slicing": {}}
            for c in counts:
                ways = [("mps", shared[:c]), ("time_slicing", slicing[:c])]
                for number in range(self.args.rounds):
                    for name, sidecars in ways if number % 2 == 0 else ways[::-1]:
                        started = time.perf_counter()
                        done = await concurrently(sidecars, text, warm, tokens)
                        wall = time.perf_counter() - started
                        runs[name].setdefault(c, []).append({"wall": wall, "audio": sum(r["audio"] for r in done)})
            pids = [client.pid for client in pool.members if client.pid is not None]
            smi = nvidia_smi_memory(pids) if device.startswith("cuda") else None
        finally:
            await pool.aclose()
        speeds = {
            name: {c: [r["audio"] / r["wall"] for r in rounds] for c, rounds in by_c.items()}
            for name, by_c in runs.items()
        }
        self.add(
            {
                **cell,
                "status": "ok",
                "max_mel_tokens": tokens,
                "attached": attached,
                "configurations": {
                    name: {str(c): {"aggregate_audio_per_second": summary(v)} for c, v in by_c.items()}
                    for name, by_c in speeds.items()
                },
                # Per round: MPS's aggregate audio seconds per second over time-slicing's in the same round.
                "mps_over_time_slicing": {
                    str(c): summary([m / t for m, t in zip(speeds["mps"][c], speeds["time_slicing"][c], strict=True)])
                    for c in counts
                },
                "nvidia_smi_mib": smi,
            }
        )

    def live_sidecars(self, model: str, default: dict[str, Any]) -> list[Sidecar]:
        plain = tuple(sorted(default.items()))
        return [s for key, s in self.shared.items() if key[0] == model and key[2] == plain and len(key) == 3]

    def batch_section(
        self, model: str, equal: bool, figures: dict[str, Any], memory: dict[str, Any], stages_ran: Any = "gpt"
    ) -> None:
        section = self.result.setdefault(
            "batch",
            {
                "equal_to_unbatched": {},
                "throughput_ratio": {},
                "first_audio_ratio": {},
                "against_unbatched": {},
                "against_sidecars": {},
                "memory": {},
            },
        )
        section["equal_to_unbatched"][model] = equal
        batched = figures["batched"]
        base = batched["1"]["aggregate_audio_per_second"]["median"]
        first = batched["1"]["first_audio"]["median"]
        section["throughput_ratio"][model] = {
            c: v["aggregate_audio_per_second"]["median"] / base for c, v in batched.items()
        }
        section["first_audio_ratio"][model] = {c: v["first_audio"]["median"] / first for c, v in batched.items()}
        # The same over a lone request that waits for no company (the batching sidecar's c = 1
        # waits BATCH_WAIT_MS first): what batching gives a user against not batching at all.
        lone = figures["unbatched"].get("1")
        if lone is not None:
            section.setdefault("throughput_ratio_over_lone", {})[model] = {
                c: v["aggregate_audio_per_second"]["median"] / lone["aggregate_audio_per_second"]["median"]
                for c, v in batched.items()
            }
        for name in ("unbatched", "sidecars"):
            other = figures[name]
            section[f"against_{name}"][model] = {
                c: v["aggregate_audio_per_second"]["median"] / other[c]["aggregate_audio_per_second"]["median"]
                for c, v in batched.items()
                if c in other
            }
        section["memory"][model] = memory
        if lone is not None:
            # First audio and each stage's throughput at c over a lone request (unbatched, c = 1):
            # a stage's time is the median of what upstream printed for the requests of a round,
            # so c rows in a stage's time t_c against one row in t_1 is c * t_1 / t_c.
            section.setdefault("first_audio_over_lone", {})[model] = {
                c: {
                    "earliest": v["first_audio_earliest"]["median"] / lone["first_audio"]["median"],
                    "median": v["first_audio"]["median"] / lone["first_audio"]["median"],
                }
                for c, v in batched.items()
            }
            # Only for the stages the sidecar ran batched: a stage run row by row (batch_stages=gpt
            # runs the CFM and the vocoder so) has a throughput of 1 by construction, and each
            # request's printed time for it includes its wait for the rows before it.
            together = BATCHED_STAGES.get(stages_ran, STAGES)
            section.setdefault("stage_throughput_ratio", {})[model] = {
                c: {
                    name: int(c) * lone["stages"][name]["median"] / v["stages"][name]["median"]
                    for name in together
                    if name in v["stages"] and name in lone["stages"] and v["stages"][name]["median"] > 0
                }
                for c, v in batched.items()
            }
            section.setdefault("row_by_row_stages", {})[model] = [name for name in STAGES if name not in together]
            section.setdefault("bound", {})[model] = {
                c: stage_bound(lone, ratios) for c, ratios in section["stage_throughput_ratio"][model].items()
            }
            over_lone = section["throughput_ratio_over_lone"][model]
            section.setdefault("over_bound", {})[model] = {
                c: over_lone[c] / bound for c, bound in section["bound"][model].items() if bound
            }
        one = batched["1"]["peak_memory"]["median"]
        section.setdefault("memory_per_extra_row", {})[model] = {
            c: (v["peak_memory"]["median"] - one) / (int(c) - 1) for c, v in batched.items() if int(c) > 1
        }
        self.save()

    async def overhead(self, stack: AsyncExitStack, model: str, voices: list[str], warm: str) -> None:
        cell: dict[str, Any] = {"kind": "overhead", "model": model, "text": "medium", **self.variant_label(model)}
        if self.over_budget():
            return self.skip(cell, "time budget spent")
        if self.default_variant(model):
            return self.skip(cell, "upstream called directly runs fp32 only here (bench/_upstream_direct.py)")
        ours = await self.sidecar(model, warm, 0, **self.default_variant(model))
        tokens = budget(model, natural_seconds(TEXTS["medium"]))
        text = TEXTS["medium"]
        async with await Direct.start(self.setup, model) as direct:
            await direct.speak(text, warm, tokens)  # its first request: the warm-up ours had
            pairs = []
            for number in range(self.args.overhead_rounds):
                order = ("ours", "upstream") if number % 2 == 0 else ("upstream", "ours")
                wall: dict[str, float] = {}
                for way in order:
                    if way == "ours":
                        wall[way] = (await ours.speak(text, warm, tokens))["wall"]
                    else:
                        wall[way] = await direct.speak(text, warm, tokens)
                pairs.append(wall)
        ratios = [p["ours"] / p["upstream"] for p in pairs]
        self.add(
            {
                **cell,
                "status": "ok",
                "max_mel_tokens": tokens,
                "ours": summary([p["ours"] for p in pairs]),
                "upstream": summary([p["upstream"] for p in pairs]),
                "ratio": summary(ratios),
                "upstream_openmp": direct.openmp,
            }
        )
        self.result.setdefault("overhead", {})[model] = summary(ratios)
        self.save()

    def variant_label(self, model: str) -> dict[str, Any]:
        return {"precision": "fp32" if self.args.device == "cpu" else HALF[model], "accel": False}


#: How long the batching sidecar waits for company: requests sent together form one batch.
BATCH_WAIT_MS = 100
#: Upstream's printed stages the batch cell compares, by the names of ``stage_throughput_ratio``.
STAGES = ("gpt", "s2mel", "vocoder")
#: The stages a batching sidecar runs as one call for all rows, by its ``batch_stages`` fact.
BATCHED_STAGES = {"gpt": ("gpt",), "all": STAGES}
#: Seconds between the batch cell's health pings for the peak memory of a round.
MEMORY_POLL = 0.25


def distinct(sidecars: list[Sidecar]) -> list[Sidecar]:
    """Each sidecar of ``sidecars`` once, in order (the same one may come several times)."""
    out: list[Sidecar] = []
    for sidecar in sidecars:
        if not any(sidecar is seen for seen in out):
            out.append(sidecar)
    return out


def memory_in_use(memory: dict[str, int]) -> int:
    """What a sidecar holds: torch's reserved device memory on a GPU, else its resident set."""
    return memory.get("cuda_reserved", memory.get("mps_driver", memory.get("rss", 0)))


def stage_bound(lone: dict[str, Any], ratios: dict[str, float]) -> Union[float, None]:
    """The end-to-end throughput at c over a lone request that the stages allow (Amdahl's law).

    A lone request's wall time is its stages' times plus the rest (conditioning, text, the
    wire); at c each batched stage runs ``ratios[stage]`` times as many rows a second as alone,
    a stage run row by row (not in ``ratios``) 1 time, and the rest is paid per request as
    alone.  So c requests take at least c x (rest + the sum of t_s / r_s), and the bound is
    wall / (rest + the sum of t_s / r_s).  None without every stage's lone time.
    """
    stages = lone["stages"]
    if any(name not in stages or ratios.get(name, 1.0) <= 0 for name in STAGES):
        return None
    wall = lone["wall"]["median"]
    times = {name: stages[name]["median"] for name in STAGES}
    rest = max(0.0, wall - sum(times.values()))
    return float(wall / (rest + sum(times[name] / ratios.get(name, 1.0) for name in STAGES)))


def round_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch cell's figures of one configuration at one c, over its rounds."""
    return {
        "aggregate_audio_per_second": summary([r["audio"] / r["wall"] for r in runs]),
        "first_audio": summary([r["first"] for r in runs]),
        "first_audio_earliest": summary([r["first_earliest"] for r in runs]),
        "wall": summary([r["wall"] for r in runs]),
        "stages": {
            name: summary([r["stages"][name] for r in runs])
            for name in STAGES
            if all(name in r["stages"] for r in runs)
        },
        "peak_memory": summary([float(r["peak_memory"]) for r in runs]),
    }


def prefill_figures(prefills: list[Any], first: int) -> Union[dict[str, Any], None]:
    """The GPT prefill of each voice's first request (the first ``first``) against the later ones'."""
    if any(value is None for value in prefills):
        return None  # an engine that does not report it
    cold, warm = summary(prefills[:first]), summary(prefills[first:])
    return {"first": cold, "second": warm, "second_over_first": round(warm["median"] / cold["median"], 3)}


async def collect(sidecar: Sidecar, text: str, voice: str, tokens: int, **options: Any) -> dict[str, Any]:
    """One streamed request, greedy: first audio, wall, its samples.  Upstream still prints its
    times for it (counted, so that later waits for a sidecar's stage times stay in step).

    In upstream's segments (``first_segment_tokens=0``; the medium text is one): a stream's
    short first segment would make each request two segments, and random weights run every
    segment to the whole token budget, so the request would cost twice what it does with the
    real model's stop token; the batch and mps cells measure batching, not segmenting.
    """
    options = {"first_segment_tokens": 0, **options}
    started = time.perf_counter()
    first = None
    pieces = []
    async with sidecar.client.stream(
        text, voice=voice, max_mel_tokens=tokens, do_sample=False, timeout=REQUEST_TIMEOUT, **options
    ) as chunks:
        async for chunk in chunks:
            if first is None:
                first = time.perf_counter() - started
            pieces.append(chunk.samples)
        facts = dict(getattr(chunks, "facts", {}))
    sidecar.requests += 1
    wall = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the stream ended without audio")
    samples = np.concatenate(pieces)
    return {"first": first, "wall": wall, "samples": samples, "audio": len(samples) / 22050, "facts": facts}


async def concurrently(sidecars: list[Sidecar], text: str, voice: str, tokens: int) -> list[dict[str, Any]]:
    """One request per entry of ``sidecars`` (the same sidecar may come several times), all at once;
    request i has seed i."""
    results: list[Any] = [None] * len(sidecars)

    async def one(i: int, sidecar: Sidecar) -> None:
        results[i] = await collect(sidecar, text, voice, tokens, seed=i)

    async with anyio.create_task_group() as group:
        for i, sidecar in enumerate(sidecars):
            group.start_soon(one, i, sidecar)
    return results


def audio_difference(a: Any, b: Any) -> dict[str, Any]:
    if a.shape != b.shape:
        return {"max": None, "share": 1.0, "samples": [int(a.size), int(b.size)]}
    difference = np.abs(a.astype(np.int32) - b.astype(np.int32))
    return {
        "max": int(difference.max()) if difference.size else 0,
        "share": float(np.count_nonzero(difference) / max(1, difference.size)),
        "samples": int(a.size),
    }


class Direct:
    """bench/_upstream_direct.py in upstream's venv: upstream's infer called in its own process."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self.lines = process.stdout
        #: OpenMP's wait setting in effect there (the sidecar's rule, so both sides wait alike).
        self.openmp: dict[str, str] = {}

    @classmethod
    async def start(cls, setup: Setup, model: str) -> Direct:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), setup.src]),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        command = [setup.python, str(ROOT / "bench" / "_upstream_direct.py"), model, str(setup.ckpts[model])]
        process = await anyio.open_process([*command, setup.device], env=env, stderr=subprocess.DEVNULL)
        direct = cls(process)
        with anyio.fail_after(LOAD_TIMEOUT):
            direct.openmp = (await direct.answer()).get("openmp", {})
        return direct

    async def answer(self) -> dict[str, Any]:
        buffer = b""
        while not buffer.endswith(b"\n"):
            data = await self.lines.receive(1)
            if not data:
                raise RuntimeError("bench/_upstream_direct.py ended early")
            buffer += data
        return json.loads(buffer)  # type: ignore[no-any-return]

    async def speak(self, text: str, voice: str, tokens: int) -> float:
        request = {"text": text, "voice": voice, "max_mel_tokens": tokens}
        await self.process.stdin.send((json.dumps(request) + "\n").encode())
        with anyio.fail_after(REQUEST_TIMEOUT):
            return float((await self.answer())["wall"])

    async def __aenter__(self) -> Direct:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.process.stdin.aclose()
        with anyio.move_on_after(30):
            await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def engine_options(precision: str, accel: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"use_accel": True} if accel else {}
    if precision != "fp32":
        options[precision] = True
    return options


# ------------------------------------------------------------------ facts about the machine


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def gpu_name() -> Union[str, None]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    done = subprocess.run(
        [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip() or None


def nvidia_smi_memory(pids: list[int]) -> Union[dict[str, int], None]:
    """Used GPU memory per process (MiB) as ``nvidia-smi`` sees it; None without it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    command = [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    seen: dict[str, int] = {}
    for line in done.stdout.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip().isdigit() and int(pid) in pids and used.strip().isdigit():
            seen[pid.strip()] = int(used)
    return seen


def upstream_commit(src: str) -> Union[str, None]:
    snapshot = Path(src, "SNAPSHOT.txt")
    if snapshot.is_file():
        match = re.search(r"commit ([0-9a-f]{7,40})", snapshot.read_text())
        if match:
            return match.group(1)
    done = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


def build_checkpoints(python: str, src: str, root: Path, models: list[str], small: bool) -> dict[str, Path]:
    """Each model's checkpoint directory, built by the conformance suite's builder unless present."""
    ckpts: dict[str, Path] = {}
    for model in models:
        kind = model if small else f"{model}-full"
        out = root / kind
        if not (out / "voice3.wav").is_file():
            started = time.monotonic()
            command = [python, str(ROOT / "tests" / "upstream" / "fixture.py"), kind, str(out), "--src", src]
            env = {
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
            }
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode:
                raise SystemExit(f"building the {kind} checkpoint failed:\n{done.stderr[-3000:]}")
            print(f"built {kind} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        warm_up_clip(out / "voice3.wav", out / "warmup.wav")
        ckpts[model] = out
    return ckpts


def warm_up_clip(source: Path, warm: Path) -> None:
    """The warm-up clip: ``source`` at another path (another key of the path-keyed voice cache)
    and one sample one int16 step off (another key of the content-keyed prefix cache), so that
    the voice_cache cell's three voices stay cold.  An older exact copy is made anew."""
    if warm.exists() and warm.read_bytes() != source.read_bytes():
        return
    with wave.open(str(source), "rb") as clip:
        params, frames = clip.getparams(), bytearray(clip.readframes(clip.getnframes()))
    frames[0] ^= 1  # the low byte of the first sample (16-bit little-endian PCM)
    warm.unlink(missing_ok=True)
    with wave.open(str(warm), "wb") as clip:
        clip.setparams(params)
        clip.writeframes(bytes(frames))


# ------------------------------------------------------------------ the table


def fmt(value: Union[dict[str, float], None], scale: float = 1.0, digits: int = 2) -> str:
    if not value:
        return "-"
    return f"{value['median'] * scale:.{digits}f} ({value['min'] * scale:.{digits}f}-{value['max'] * scale:.{digits}f})"


def fmt_or_dash(value: Union[float, None]) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(result: dict[str, Any]) -> str:
    lines = []
    cells = result["cells"]
    lines.append("throughput: audio seconds per second, median (min-max); upstream's stage times, s")
    lines.append(
        f"{'model':5} {'precision':9} {'accel':5} {'text':6} {'audio/s':20} {'audio s':6} "
        f"{'gpt':6} {'s2mel':6} {'vocoder':7}"
    )
    for cell in cells:
        if cell["kind"] != "throughput":
            continue
        head = f"{cell['model']:5} {cell['precision']:9} {cell['accel']!s:5} {cell['text']:6} "
        if cell["status"] != "ok":
            lines.append(head + f"{cell['status']}: {cell['reason']}")
            continue
        stages = cell["stages"]
        parts = [fmt(stages.get(name), digits=2).split(" ")[0] for name in ("gpt", "s2mel", "vocoder")]
        lines.append(
            head + f"{fmt(cell['audio_per_second']):20} {cell['audio_seconds']['median']:6.2f} "
            f"{parts[0]:6} {parts[1]:6} {parts[2]:7}"
        )
    for cell in cells:
        label = f"{cell['kind']} model={cell['model']} {cell.get('precision', '')}"
        if cell["status"] != "ok" and cell["kind"] != "throughput":
            lines.append(f"{label}: {cell['status']}: {cell['reason']}")
        elif cell["kind"] == "stream":
            stops = (
                f"natural stops, GPT caps streamed {cell['segment_caps_streamed']}, whole {cell['segment_caps_whole']}"
                if cell.get("natural_stop")
                else f"no natural stop, every segment to {cell['max_mel_tokens_per_segment']} tokens"
            )
            lines.append(
                f"{label}: {cell['segments']} segments; first chunk {fmt(cell['first_audio_streamed'])} s, "
                f"whole {fmt(cell['whole'])} s, first/whole {fmt(cell['first_over_whole'])}; {stops}"
            )
        elif cell["kind"] == "voice_cache":
            prefill = cell.get("gpt_prefill") or {}
            lines.append(
                f"{label} voice_cache={cell['voice_cache']} prefix_cache={cell.get('prefix_cache')}: first round "
                f"{fmt(cell['first_round'])} s, later rounds {fmt(cell['later_rounds'])} s; GPT prefill first "
                f"{fmt(prefill.get('first'), digits=3)} s, second {fmt(prefill.get('second'), digits=3)} s "
                f"(ratio {prefill.get('second_over_first')})"
            )
        elif cell["kind"] == "batch":
            parts = []
            for name, by_c in cell["configurations"].items():
                speeds = ", ".join(f"c={c}: {v['aggregate_audio_per_second']['median']:.2f}" for c, v in by_c.items())
                parts.append(f"{name} {speeds}")
            lines.append(f"{label}: equal audio {cell['equal_to_unbatched']}; audio s/s: " + "; ".join(parts))
            section = result.get("batch", {})
            for key in ("stage_throughput_ratio", "first_audio_over_lone"):
                by_c = section.get(key, {}).get(cell["model"])
                if by_c:
                    shown = "; ".join(
                        f"c={c}: " + ", ".join(f"{name} {value:.2f}" for name, value in v.items())
                        for c, v in by_c.items()
                    )
                    lines.append(f"    {key}: {shown}")
            for key in ("throughput_ratio_over_lone", "bound", "over_bound"):
                flat = section.get(key, {}).get(cell["model"])
                if flat:
                    shown = ", ".join(f"c={c}: {fmt_or_dash(value)}" for c, value in flat.items())
                    lines.append(f"    {key}: {shown}")
        elif cell["kind"] == "floor":
            floor = result.get("floor", {}).get(cell["model"], {})
            over = floor.get("measured_over_floor") or {}
            lines.append(
                f"{label}: {cell['bandwidth']['bytes_per_s'] / 1e9:.1f} GB/s read, "
                f"{cell['matmul']['flops_per_s'] / 1e9:.0f} GFLOP/s fp32 ({cell['threads']} threads); floor: "
                f"GPT {floor.get('gpt_step_s', 0) * 1e3:.1f} ms/step ({UPSTREAM_BEAMS} beams), "
                f"s2mel {floor.get('s2mel_s', 0):.3f} s, vocoder {floor.get('vocoder_s', 0):.4f} s; measured/floor: "
                + (", ".join(f"{name} {value:.1f}" for name, value in over.items()) or "-")
            )
        elif cell["kind"] == "mps":
            ratios = ", ".join(f"c={c}: {fmt(v)}" for c, v in cell["mps_over_time_slicing"].items())
            lines.append(f"{label}: attached {cell['attached']}; MPS over time-slicing, audio s/s: {ratios}")
        elif cell["kind"] == "overhead":
            lines.append(f"{label}: ours over upstream in process {fmt(cell['ratio'], digits=3)}")
        elif cell["kind"] == "sidecars":
            memory = ", ".join(str(m.get("cuda_reserved", m.get("rss", 0)) // 2**20) for m in cell["memory"])
            lines.append(
                f"{label} sidecars={cell['sidecars']}: {cell['aggregate_audio_per_second']:.2f} audio s/s over "
                f"{cell['requests']} requests; memory per sidecar (MiB, reserved by torch or RSS): {memory}"
            )
    return "\n".join(lines)


def parse_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def main(argv: Union[list[str], None] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="the tiny fixtures (CPU, minutes) instead of full size")
    parser.add_argument("--device", help="cpu, cuda:0...; default cuda:0, or cpu with --small")
    parser.add_argument("--models", type=parse_list, default=["2", "2.5"])
    parser.add_argument("--texts", type=parse_list, default=list(TEXTS))
    parser.add_argument(
        "--cells",
        type=parse_list,
        default=["floor", "throughput", "stream", "voice_cache", "sidecars", "batch", "overhead", "mps"],
    )
    parser.add_argument(
        "--concurrency", type=lambda v: [int(i) for i in parse_list(v)], default=[1, 2, 4, 8], help="batch cell's c"
    )
    parser.add_argument(
        "--batch-stages",
        choices=["auto", "gpt", "all"],
        help="the batching sidecar's engine option batch_stages (default: the engine's, auto)",
    )
    parser.add_argument(
        "--first-segment-tokens",
        type=int,
        help="stream cell: the streamed request's first segment cut at this many text tokens (0: upstream's; "
        f"default: the engine's for a stream, {STREAM_FIRST_SEGMENT_TOKENS})",
    )
    parser.add_argument(
        "--no-natural-stop",
        dest="natural_stop",
        action="store_false",
        help="stream cell: every segment runs to the request's max_mel_tokens (random weights never stop), "
        "not to its text's natural length (bench/_natural_stop.py)",
    )
    parser.add_argument(
        "--unbatched-at",
        type=lambda v: [int(i) for i in parse_list(v)],
        help="batch cell: the c at which the sidecar that does not batch runs too (default: every c; "
        "1 always); its c requests run one after another, so c = 1 gives its speed",
    )
    parser.add_argument("--overhead-rounds", type=int, help="overhead cell's interleaved pairs; default 10, 5 --small")
    parser.add_argument("--precisions", type=parse_list, default=["fp32", "half"], help="fp32, half (fp16/bf16)")
    parser.add_argument(
        "--accel",
        type=lambda v: [item == "on" for item in parse_list(v)],
        default=[False, True],
        help="off,on: use_accel values",
    )
    parser.add_argument("--sidecars", type=lambda v: [int(i) for i in parse_list(v)], default=[1, 2, 4])
    parser.add_argument(
        "--parallel-loads", type=int, help="sidecars loading at once; default 8 on a GPU, 1 on the CPU (memory)"
    )
    parser.add_argument("--rounds", type=int, help="rounds per cell; default 3, or 1 with --small")
    parser.add_argument("--scale", type=float, help="fraction of natural speech per budget; 1, or 0.1 with --small")
    parser.add_argument("--budget", type=float, help="seconds after which cells not yet begun are skipped")
    parser.add_argument("--ckpt-root", help="where checkpoints are built and kept (default: a temporary folder)")
    parser.add_argument("--out", default="bench_gpu.json", help="the JSON file (default bench_gpu.json)")
    args = parser.parse_args(argv)
    args.device = args.device or ("cpu" if args.small else "cuda:0")
    args.rounds = args.rounds or (1 if args.small else 3)
    args.overhead_rounds = args.overhead_rounds or (5 if args.small else 10)
    args.parallel_loads = args.parallel_loads or (1 if args.device == "cpu" else 8)
    SCALE[0] = args.scale or (0.1 if args.small else 1.0)
    for name in args.models:
        if name not in ENGINES:
            parser.error(f"unknown model {name!r}: 2 or 2.5")
    for name in args.texts:
        if name not in TEXTS:
            parser.error(f"unknown text {name!r}: {', '.join(TEXTS)}")
    found = upstream_env()
    if found is None:
        return 2
    python, src = found
    out = Path(args.out).resolve()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        root = Path(args.ckpt_root) if args.ckpt_root else Path(tmp)
        ckpts = build_checkpoints(python, src, root, args.models, args.small)
        with stage_log() as stages:
            run = Run(args, Setup(python, src, args.device, ckpts, stages), out)

            async def body() -> None:
                for model in args.models:
                    await run.model(model)

            run.save()
            anyio.run(body)
    run.result["config"]["seconds"] = time.monotonic() - run.started
    run.save()
    print(table(run.result))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
