"""BigVGAN in bfloat16, which parts: the ``bf16_vocoder`` knob's choice, measured.

Runs in upstream's venv with this repository and the GitHub checkout on ``PYTHONPATH``; random
weights at the published width (``bench_vocoder.build``), one mel of ``--frames`` frames::

    PYTHONPATH=.:bench:../shared/upstream/index-tts $INDEXTTS_UPSTREAM_PYTHON bench/bench_vocoder_bf16.py \\
        --frames 206 --rounds 3

Interleaved round after round: float32; the dense convolutions of at least N channels in and
out in bfloat16 (``_precision.vocoder_bf16``, whose bound ``VOCODER_MIN_CHANNELS`` is set to
each N of ``--channels``); and the whole vocoder under bfloat16 autocast.  Prints each one's
median wall time and its SNR against float32 (dB).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench_vocoder import build

from indextts_sidecar.engines.indextts import _precision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=206)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--channels", default="768,384,192,96,48")
    args = parser.parse_args()
    import torch

    model, width = build(0, "cpu")
    torch.manual_seed(1)
    mel = torch.randn(1, 80, args.frames) * 2 - 4

    def convs(bound: int) -> Callable[[], Any]:
        @contextlib.contextmanager
        def region() -> Iterator[None]:
            _precision.VOCODER_MIN_CHANNELS = bound
            with _precision.vocoder_bf16(model, True):
                yield

        return region

    paths: dict[str, Callable[[], Any]] = {"float32": contextlib.nullcontext}
    paths.update({f"convs >= {n}": convs(int(n)) for n in args.channels.split(",")})
    paths["whole, autocast"] = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    times: dict[str, list[float]] = {name: [] for name in paths}
    snr: dict[str, float] = {}
    with torch.no_grad():
        reference = model(mel).float()
        for _ in range(args.rounds):
            for name, region in paths.items():
                with region():
                    started = time.perf_counter()
                    out = model(mel)
                    times[name].append(time.perf_counter() - started)
                error = float(((out.float() - reference) ** 2).sum())
                snr[name] = math.inf if error == 0 else 10 * math.log10(float((reference**2).sum()) / error)
    seconds = args.frames * 256 / 22050
    print(
        f"BigVGAN at width {width}, {args.frames} frames ({seconds:.2f} s of audio), {torch.get_num_threads()} threads"
    )
    print("| path | median s | rounds | SNR dB against float32 |")
    print("|---|---|---|---|")
    for name, values in times.items():
        spread = f"{min(values):.3f}-{max(values):.3f}"
        print(f"| {name} | {statistics.median(values):.3f} | {spread} | {snr[name]:.1f} |")


if __name__ == "__main__":
    main()
