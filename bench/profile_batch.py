"""Where a batch's time goes on the CPU: one request alone against a batch, stage by stage.

Runs in upstream's venv with this repository and the GitHub checkout on ``PYTHONPATH``, on a
conformance fixture (``tests/upstream/fixture.py 2|2.5 DIR``), driving the adapter directly::

    PYTHONPATH=.:../shared/upstream/index-tts $INDEXTTS_UPSTREAM_PYTHON bench/profile_batch.py 2 DIR \\
        [--batch 4] [--rounds 3] [--threads 1] [--batch-stages auto|gpt|all] [--tokens N]

The requests are ``bench_gpu.py``'s batch cell's: the medium text, greedy, a seed each, the
``--small`` token budget (29 GPT tokens for 2, 14 for 2.5; ``--tokens`` for another, e.g. a
full-size fixture's), one voice; ``--batch-stages`` is the engine option (docs/indextts.md,
"Batching": on a CPU ``auto`` batches the GPT only, the CFM and vocoder run row by row).  Each round runs
``--batch`` requests one after another (``synthesize()``), then as one batch
(``synthesize_batch()``), and prints:

* the CPU time of each stage, measured with ``time.thread_time`` in the thread that runs it
  (upstream's calls on the request's worker thread, the batched calls on the coordinator), so
  that a machine shared with other work inflates it far less than wall time.  With
  ``--threads 1`` (torch's intra-op threads) all of a stage's arithmetic runs in that thread,
  and the figures add up to the process's CPU time; with more threads they show the calling
  thread's share only, and only the wall times are whole.
* each way's first audio: alone, each request's from its own start; batched, each request's
  from the batch's start (earliest, median, last);
* the process's CPU time and the wall time of both ways, and their ratio: the batch's
  throughput over one request's (four requests' audio in the batch's time against one
  request's audio in its own), as ``bench_gpu.py``'s ``throughput_ratio`` at c = ``--batch``.

Stages: upstream's model calls (the GPT's decoding, ``inference_speech``; the s2mel CFM; the
vocoder; the GPT's latent pass; the emotion vector, ``merge_emovec``; the text tokenizer with its
normalisation), the same calls as the coordinator runs them batched ("batched ..."), and what
is left (references, length regulator, the lockstep's hand-overs, our PCM conversion).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import torch

from indextts_sidecar.engines import BatchItem, ItemDone, SynthesisRequest
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine, _batched

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs back to the woods."
TOKENS = {"2": 29, "2.5": 14}

CPU: dict[str, float] = collections.defaultdict(float)
COUNT: dict[str, int] = collections.defaultdict(int)
_local = threading.local()


def timed(label: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` with its thread CPU time added to ``label`` (the outermost timed call only)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "inside", False):
            return original(*args, **kwargs)
        _local.inside = True
        started = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            _local.inside = False
            CPU[label] += time.thread_time() - started
            COUNT[label] += 1

    return call


def instrument(model: Any) -> None:
    """Time each stage on the loaded instance (after the adapter's interceptors are installed)."""
    gpt = model.gpt
    stages = [
        (gpt, "inference_speech", "GPT decoding"),
        (model.s2mel.models["cfm"], "inference", "s2mel CFM"),
        (model.bigvgan, "forward", "vocoder"),
        (gpt, "forward", "GPT latent pass"),
        (gpt, "merge_emovec", "emotion vector"),
        (model.tokenizer, "tokenize", "tokenizer"),
    ]
    for owner, name, label in stages:
        setattr(owner, name, timed(label, getattr(owner, name)))
    run = _batched._run

    def batched(torch_: Any, hooks: Any, kind: str, key: Any, group: Any) -> Any:
        return timed(f"batched {kind} ({len(group)} rows)", run)(torch_, hooks, kind, key, group)

    _batched._run = batched


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", choices=sorted(TOKENS))
    parser.add_argument("ckpt")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's own)")
    parser.add_argument("--batch-stages", choices=["auto", "gpt", "all"], default="auto")
    parser.add_argument("--tokens", type=int, help="GPT tokens per request (default: the --small budget)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cls = IndexTTS2Engine if args.version == "2" else IndexTTS25Engine
    options = {
        "model_dir": args.ckpt,
        "device": "cpu",
        "use_qwen_emo": False,
        "max_batch": max(2, args.batch),
        "batch_stages": args.batch_stages,
    }
    tokens = args.tokens or TOKENS[args.version]
    engine: Any = cls(msgspec.convert(options, cls.Options))
    engine.load(lambda *a: None, lambda: False)

    def request(seed: int) -> Any:
        opts = {"do_sample": False, "seed": seed, "max_mel_tokens": tokens}
        return SynthesisRequest(
            id=seed,
            text=TEXT,
            voice=f"{args.ckpt}/voice.wav",
            emotion=None,
            options=msgspec.convert(opts, cls.RequestOptions),
        )

    firsts: dict[str, list[float]] = {}

    def alone() -> None:
        firsts["one after another"] = []
        for seed in range(args.batch):
            started = time.perf_counter()
            for number, _chunk in enumerate(engine.synthesize(request(seed), lambda *a: None, lambda: False)):
                if number == 0:
                    firsts["one after another"].append(time.perf_counter() - started)

    def batch() -> None:
        items = [BatchItem(request(seed), lambda *a: None, lambda: False) for seed in range(args.batch)]
        started = time.perf_counter()
        first: dict[int, float] = {}
        for index, value in engine.synthesize_batch(items):
            if not isinstance(value, ItemDone) and index not in first:
                first[index] = time.perf_counter() - started
        firsts["one batch"] = sorted(first.values())

    batch()  # warm-up; installs the interceptors
    alone()
    instrument(engine._model)
    ratios = []
    print(
        f"IndexTTS-{args.version}, torch intra-op threads {torch.get_num_threads()}, batch of {args.batch}, "
        f"batch_stages {engine.batch_stages()}, {tokens} GPT tokens a request"
    )
    for number in range(args.rounds):
        walls = {}
        for name, way in (("one after another", alone), ("one batch", batch)):
            CPU.clear()
            COUNT.clear()
            cpu, wall = time.process_time(), time.perf_counter()
            way()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            walls[name] = wall
            print(f"round {number}, {args.batch} requests {name}: wall {wall:.3f} s, process CPU {cpu:.3f} s")
            for label in sorted(CPU, key=lambda label: -CPU[label]):
                print(f"    {label:28s} {CPU[label]:7.3f} s  ({COUNT[label]} calls)")
            print(f"    {'the rest':28s} {cpu - sum(CPU.values()):7.3f} s")
            seen = sorted(firsts[name])
            print(
                f"    first audio (each request from its own start alone, from the batch's start batched): "
                f"earliest {seen[0]:.3f} s, median {statistics.median(seen):.3f} s, last {seen[-1]:.3f} s"
            )
        # The batch's audio per second against one request's: per = one after another / batch.
        ratios.append(walls["one after another"] / walls["one batch"])
    print(
        f"throughput ratio (one after another / one batch, wall): median {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}-{max(ratios):.2f}) over {len(ratios)} rounds"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
