"""Upstream's BigVGAN on b mel rows at once against one row at a time: is a batched vocoder faster?

Runs in upstream's venv, with the GitHub checkout on ``PYTHONPATH``; random weights from
upstream's own BigVGAN class and config (``nvidia/bigvgan_v2_22khz_80band_256x``, the one
IndexTTS uses), at its published width and at the conformance fixture's narrow one::

    PYTHONPATH=../shared/upstream/index-tts $INDEXTTS_UPSTREAM_PYTHON bench/bench_vocoder.py \\
        --device cpu --rows 1,2,4,8 --frames 172 --rounds 5

For each width and b: the wall time of one call on b rows, and of b calls on one row each
(the adapter's ``batch_vocoder`` on and off), interleaved round after round; prints the
medians and their ratio (per-row time over batched time: above 1, batching is faster).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from typing import Any


def build(width: int, device: str) -> Any:
    import torch
    from indextts.s2mel.modules.bigvgan import bigvgan, env

    config = os.path.join(os.path.dirname(bigvgan.__file__), "config.json")
    with open(config) as f:
        hparams = json.load(f)
    if width:
        hparams["upsample_initial_channel"] = width
    torch.manual_seed(0)
    model = bigvgan.BigVGAN(env.AttrDict(hparams), use_cuda_kernel=False)
    model.remove_weight_norm()
    return model.eval().to(device), hparams["upsample_initial_channel"]


def one_by_one(model: Any, mels: Any) -> list[Any]:
    return [model(mels[i : i + 1]) for i in range(mels.size(0))]


def timed(call: Any, device: str) -> float:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.inference_mode():
        call()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--frames", type=int, default=172, help="mel frames per row (172: 2 s at 22050 Hz)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--widths", default="64,0", help="upsample_initial_channel; 0: the published 1536")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    for width in (int(w) for w in args.widths.split(",")):
        model, channels = build(width, args.device)
        for b in rows:
            mels = torch.randn(b, 80, args.frames, device=args.device)
            ways = {"together": functools.partial(model, mels), "apart": functools.partial(one_by_one, model, mels)}
            timed(ways["together"], args.device)  # warm-up
            times: dict[str, list[float]] = {"together": [], "apart": []}
            for number in range(args.rounds):
                for name in ("together", "apart") if number % 2 == 0 else ("apart", "together"):
                    times[name].append(timed(ways[name], args.device))
            ratios = [a / t for a, t in zip(times["apart"], times["together"], strict=True)]
            print(
                f"channels={channels} rows={b} frames={args.frames}: "
                f"batched {statistics.median(times['together']) * 1000:.0f} ms, "
                f"one by one {statistics.median(times['apart']) * 1000:.0f} ms, "
                f"one-by-one/batched {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
