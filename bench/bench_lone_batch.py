"""What a lone request costs through the batch path (a batch of one that others may join).

With continuous batching (engine option ``join_batches``, on with ``max_batch`` 2 or more) the
sidecar runs a lone request through ``synthesize_batch()`` as a batch of one: upstream's
generator in a worker thread, its model calls parked and handed to the coordinator, and the
sidecar's ``join`` asked at every step.  This measures that against ``synthesize()``
(upstream's generator on the engine thread), in process, on a conformance fixture
(``tests/upstream/fixture.py 2|2.5 DIR``)::

    PYTHONPATH=.:../shared/upstream/index-tts $INDEXTTS_UPSTREAM_PYTHON bench/bench_lone_batch.py 2 DIR \\
        [--rounds 10] [--threads 1] [--greedy]

Each round runs the same request both ways, in alternating order (interleaved, so that a
machine's changing load falls on both), after one warm-up of each.  The request is
``bench_gpu.py``'s batch cell's: the medium text, one voice, the ``--small`` token budget;
sampled as upstream samples unless ``--greedy`` (greedy with a seed: the two ways then give
the same audio, which is checked).  Prints, per round, the wall and process CPU time of each
way and their ratio (batch path over ``synthesize``), then the median ratio and its spread.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import torch

from indextts_sidecar.engines import BatchItem, ItemDone, SynthesisRequest
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs back to the woods."
TOKENS = {"2": 29, "2.5": 14}


def quiet(*args: Any) -> None:
    pass


def never() -> bool:
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", choices=["2", "2.5"])
    parser.add_argument("ckpt")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (0: torch's default)")
    parser.add_argument("--greedy", action="store_true", help="greedy with a seed (audio compared)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cls = IndexTTS2Engine if args.version == "2" else IndexTTS25Engine
    options = {"model_dir": args.ckpt, "device": "cpu", "use_qwen_emo": False, "max_batch": 4}
    engine: Any = cls(msgspec.convert(options, cls.Options))
    engine.load(quiet, never)
    assert engine.joins_batches
    request_options: dict[str, Any] = {"max_mel_tokens": TOKENS[args.version]}
    if args.greedy:
        request_options.update(do_sample=False, seed=1)
    request = SynthesisRequest(
        id=1,
        text=TEXT,
        voice=f"{args.ckpt}/voice.wav",
        emotion=None,
        options=msgspec.convert(request_options, cls.RequestOptions),
    )
    engine.check(request)
    joins = 0

    def nobody(room: int) -> list[BatchItem[Any]]:
        nonlocal joins
        joins += 1
        return []

    def alone() -> np.ndarray:
        return np.concatenate(list(engine.synthesize(request, quiet, never)))

    def batch_of_one() -> np.ndarray:
        pieces = []
        for _, value in engine.synthesize_batch([BatchItem(request, quiet, never)], nobody):
            if isinstance(value, ItemDone):
                assert value.error is None, value.error
            else:
                pieces.append(value)
        return np.concatenate(pieces)

    def timed(way: Callable[[], np.ndarray]) -> tuple[float, float, np.ndarray]:
        wall, cpu = time.perf_counter(), time.process_time()
        audio = way()
        return time.perf_counter() - wall, time.process_time() - cpu, audio

    timed(alone), timed(batch_of_one)  # warm-up: the voice cached, torch's first-call costs paid
    walls: list[float] = []
    cpus: list[float] = []
    print(f"model {args.version}, {'greedy' if args.greedy else 'sampled'}, threads {torch.get_num_threads()}")
    for round_ in range(args.rounds):
        first, second = (alone, batch_of_one) if round_ % 2 == 0 else (batch_of_one, alone)
        results = {first: timed(first), second: timed(second)}
        (a_wall, a_cpu, a_audio), (b_wall, b_cpu, b_audio) = results[alone], results[batch_of_one]
        if args.greedy:
            difference = np.abs(a_audio.astype(np.int32) - b_audio.astype(np.int32))
            assert a_audio.shape == b_audio.shape and int(difference.max(initial=0)) <= 1
        walls.append(b_wall / a_wall)
        cpus.append(b_cpu / a_cpu)
        print(
            f"round {round_}: synthesize {a_wall:.3f} s wall {a_cpu:.3f} s CPU; batch of one {b_wall:.3f} s wall "
            f"{b_cpu:.3f} s CPU; ratio wall {walls[-1]:.3f} CPU {cpus[-1]:.3f}"
        )
    print(
        f"batch of one / synthesize, median of {args.rounds}: wall {statistics.median(walls):.3f} "
        f"({min(walls):.3f}-{max(walls):.3f}), CPU {statistics.median(cpus):.3f} ({min(cpus):.3f}-{max(cpus):.3f}); "
        f"join asked {joins / (args.rounds + 1):.0f} times a request"
    )


if __name__ == "__main__":
    main()
