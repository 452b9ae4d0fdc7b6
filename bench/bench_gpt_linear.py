"""The GPT-2 stack's linear layers at full size, three ways, by the rows a product carries.

Runs in upstream's venv (torch only; nothing of upstream's is loaded).  Random float32 weights
of IndexTTS-2's and 2.5's GPT (24 layers, model width 1280: per layer ``c_attn`` 1280x3840,
``c_proj`` 1280x1280, ``c_fc`` 1280x5120, ``mlp.c_proj`` 5120x1280; 1.89 GB), multiplied by
``rows`` rows the way each path does it:

- ``mkl``: transformers' ``Conv1D`` (``torch.addmm`` with the weight stored ``[in, out]``), the
  path upstream runs;
- ``onednn``: oneDNN's linear over the weights reordered once for three rows
  (``torch.ops.mkldnn._reorder_linear_weight``, ``_linear_pointwise``), the adapter's
  ``packed_linear`` (``_gpt_fast.py``);
- ``mkl_transposed``: MKL with the weight stored ``[out, in]`` (``nn.Linear``'s layout);
- ``onednn_bf16``: oneDNN's linear over the same weights cast to bfloat16 and reordered
  likewise, the input cast to bf16 each call: ``packed_linear`` under ``bf16_weights`` (half
  the bytes; on a CPU with AMX or AVX512-BF16; left out, saying why, where oneDNN refuses the
  layout).

Then the vocabulary head (``mel_head``, an ``nn.Linear`` of 1280 x 8194, 42 MB), which a
decoding step runs after the stack: by MKL (``F.linear``, upstream's) and over oneDNN's layout
(``packed_linear`` lays it out too), each call timed alone right after an untimed ``onednn``
pass, so that the head is read from memory as in a step, not from the cache.

Each figure is the median of ``--repeats`` passes over the 96 products of the 24 layers; the row
counts are interleaved, and the whole runs ``--rounds`` times.  Beside them, a ``sum()`` over the
weights (the read a pass cannot beat)::

    $(python3 tests/upstream/build_venv.py github) bench/bench_gpt_linear.py --rounds 2
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

WIDTH = 1280
LAYERS = 24
#: Each path's column heading.
LABELS = {
    "mkl": "mkl (upstream)",
    "onednn": "onednn (packed_linear)",
    "mkl_transposed": "mkl, [out, in]",
    "onednn_bf16": "onednn, bf16 (bf16_weights)",
}
SHAPES = ((WIDTH, 3 * WIDTH), (WIDTH, WIDTH), (WIDTH, 4 * WIDTH), (4 * WIDTH, WIDTH))
#: The vocabulary head's output width (``number_mel_codes``, both versions).
CODES = 8194


def timed(work: Callable[[], Any], repeats: int, before: Callable[[], Any] = lambda: None) -> float:
    work()
    times = []
    for _ in range(repeats):
        before()
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,3,4,8,12,24,100,300")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    weights = [[torch.randn(i, o) * 0.02 for i, o in SHAPES] for _ in range(LAYERS)]
    biases = [[torch.randn(o) * 0.02 for _i, o in SHAPES] for _ in range(LAYERS)]
    transposed = [[w.t().contiguous().t() for w in layer] for layer in weights]
    reorder = torch.ops.mkldnn._reorder_linear_weight
    packed = [[reorder(w.t().contiguous(), 3) for w in layer] for layer in weights]
    bf16 = torch.bfloat16
    try:
        packed_bf16 = [[reorder(w.t().contiguous().to(bf16), 3) for w in layer] for layer in weights]
    except RuntimeError as exc:  # a CPU without bf16 matrix instructions: oneDNN refuses the layout
        packed_bf16 = []
        print(f"no onednn_bf16 column: {exc}")
    biases_bf16 = [[b.to(bf16) for b in layer] for layer in biases]
    linear = torch.ops.mkldnn._linear_pointwise
    head, head_bias = torch.randn(CODES, WIDTH) * 0.02, torch.randn(CODES) * 0.02  # nn.Linear: [out, in]
    head_packed = reorder(head, 3)

    def paths(rows: int) -> dict[str, Callable[[], None]]:
        inputs = {WIDTH: torch.randn(rows, WIDTH), 4 * WIDTH: torch.randn(rows, 4 * WIDTH)}

        def mkl(stored: list[list[torch.Tensor]]) -> Callable[[], None]:
            def run() -> None:
                for layer, bias in zip(stored, biases, strict=True):
                    for w, b in zip(layer, bias, strict=True):
                        torch.addmm(b, inputs[w.shape[0]], w)

            return run

        def onednn() -> None:
            for layer, plain, bias in zip(packed, weights, biases, strict=True):
                for w, p, b in zip(layer, plain, bias, strict=True):
                    linear(inputs[p.shape[0]], w, b, "none", [], "")

        def onednn_bf16() -> None:
            for layer, plain, bias in zip(packed_bf16, weights, biases_bf16, strict=True):
                for w, p, b in zip(layer, plain, bias, strict=True):
                    linear(inputs[p.shape[0]].to(bf16), w, b, "none", [], "")

        runs = {"mkl": mkl(weights), "onednn": onednn, "mkl_transposed": mkl(transposed)}
        return {**runs, "onednn_bf16": onednn_bf16} if packed_bf16 else runs

    size = sum(w.numel() * w.element_size() for layer in weights for w in layer)
    print(f"{size / 1e9:.2f} GB of weights, {torch.get_num_threads()} threads; ms per pass over the 24 layers")
    for number in range(args.rounds):
        read = timed(lambda: [w.sum() for layer in weights for w in layer], args.repeats)
        print(f"round {number + 1}: sum() over the weights {read * 1e3:.1f} ms")
        columns = [LABELS[name] for name in paths(1)]
        print("| rows | " + " | ".join(columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        for rows in (int(r) for r in args.rows.split(",")):
            figures = {name: timed(run, args.repeats) for name, run in paths(rows).items()}
            print(f"| {rows} | " + " | ".join(f"{figures[n] * 1e3:.1f}" for n in figures) + " |")
        print("the head, after a pass over the stack (ms a call):")
        print("| rows | mkl, F.linear (upstream) | onednn (packed_linear) |")
        print("|---|---|---|")
        for rows in (int(r) for r in args.rows.split(",")):
            x, stack = torch.randn(rows, WIDTH), paths(rows)["onednn"]
            by_mkl = timed(functools.partial(torch.nn.functional.linear, x, head, head_bias), args.repeats, stack)
            packed_head = functools.partial(linear, x, head_packed, head_bias, "none", [], "")
            by_onednn = timed(packed_head, args.repeats, stack)
            print(f"| {rows} | {by_mkl * 1e3:.2f} | {by_onednn * 1e3:.2f} |")


if __name__ == "__main__":
    main()
