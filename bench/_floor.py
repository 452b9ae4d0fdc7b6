"""The floor of each IndexTTS stage on one device: bench_gpu's ``floor`` cell.

Runs in upstream's venv (``INDEXTTS_UPSTREAM_PYTHON``), with the GitHub checkout and this
repository on ``PYTHONPATH``::

    echo '{"text": "...", "voice": "clip.wav", "max_mel_tokens": 72}' | \\
        python bench/_floor.py 2|2.5 MODEL_DIR DEVICE

Measures, with the intra-op threads torch uses here (``torch.get_num_threads()``) and their
idle waits bounded as in the sidecar (``openmp_waits``, reported as ``openmp``):

* memory-read bandwidth: the best of several ``sum()`` over a float32 tensor far larger than
  the caches (256 MiB on a CPU, 1 GiB on a GPU), bytes read over seconds;
* fp32 matmul throughput: the best of several square ``mm`` (1024 and 2048), 2 n^3 FLOPs each.

Then loads the model as ``_upstream_direct.py`` does and speaks the request once (upstream's
``infer``, one beam, its forced sampling: the shapes are what count), counting:

* the GPT: the bytes one decoding step reads, the weights of the decoder that runs every step
  (upstream's GPT-2 stack, its final norm, its mel head) plus the KV cache at that step's
  context, 2 x layers x model_dim x context x element size a row, the context read from each
  step's attention mask; averaged over the decoding steps (the prefill excluded).  Floor:
  bytes / bandwidth, for 1, 2, 3 (upstream's default beams), 4 and 8 rows a step (the
  weights once, the KV of every row);
* s2mel (the CFM, ``s2mel.models["cfm"].inference``: 25 steps of the DiT with its two guidance
  rows) and BigVGAN: their FLOPs as ``torch.utils.flop_counter.FlopCounterMode`` counts them
  from the shapes of each matrix product, convolution and attention (2 per multiply-add);
  elementwise work (activations, norms) is not counted.  Floor: FLOPs / matmul throughput.

Answers one JSON line on the stdout it was given; upstream's prints go to stderr.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from typing import Any

from _upstream_direct import load_model

from indextts_sidecar.engines.indextts._upstream import openmp_waits

#: Rows a decoding step may carry: a lone request, upstream's three beams, batches.
ROWS = (1, 2, 3, 4, 8)


def sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def best(torch: Any, device: str, work: Any, repeats: int) -> float:
    work()
    sync(torch, device)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        sync(torch, device)
        times.append(time.perf_counter() - started)
    return min(times)


def bandwidth(torch: Any, device: str) -> dict[str, Any]:
    elements = 1 << 28 if device.startswith("cuda") else 1 << 26  # 1 GiB / 256 MiB of float32
    data = torch.ones(elements, dtype=torch.float32, device=device)
    seconds = best(torch, device, data.sum, 8)
    return {"bytes": data.numel() * 4, "seconds": seconds, "bytes_per_s": data.numel() * 4 / seconds}


def matmul(torch: Any, device: str) -> dict[str, Any]:
    figures = {}
    for n in (1024, 2048):
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        seconds = best(torch, device, lambda a=a, b=b: torch.mm(a, b), 4)
        figures[str(n)] = 2 * n**3 / seconds
    return {"flops_per_s_by_size": figures, "flops_per_s": max(figures.values())}


def parameter_bytes(*modules: Any) -> int:
    return sum(p.numel() * p.element_size() for module in modules for p in module.parameters())


def main() -> int:
    version, model_dir, device = sys.argv[1:4]
    request = json.loads(sys.stdin.readline())
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # upstream's prints
    sys.stdout = sys.stderr
    openmp = openmp_waits()  # OpenMP's idle threads wait as in the sidecar: set before torch loads
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    machine = {
        "threads": torch.get_num_threads(),
        "openmp": openmp,
        "bandwidth": bandwidth(torch, device),
        "matmul": matmul(torch, device),
    }
    model = load_model(version, model_dir, device)
    gpt = model.gpt
    weights = parameter_bytes(gpt.gpt, gpt.final_norm, gpt.mel_head)
    element = next(gpt.gpt.parameters()).element_size()
    steps: list[tuple[int, int]] = []  # (rows, context) of each decoding step
    inference_model = gpt.inference_model
    step_original = inference_model.forward

    @functools.wraps(step_original)  # Hugging Face's generate reads its signature
    def step(*args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("attention_mask")
        if kwargs.get("past_key_values") and mask is not None:  # a decoding step, not the prefill
            steps.append((int(mask.shape[0]), int(mask.shape[1])))
        return step_original(*args, **kwargs)

    flops = {"s2mel": 0, "vocoder": 0}
    calls = {"s2mel": 0, "vocoder": 0}

    def counted(stage: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with FlopCounterMode(display=False) as counter:
                out = original(*args, **kwargs)
            flops[stage] += counter.get_total_flops()
            calls[stage] += 1
            return out

        return call

    cfm = model.s2mel.models["cfm"]
    inference_model.forward = step
    cfm.inference = counted("s2mel", cfm.inference)
    model.bigvgan.forward = counted("vocoder", model.bigvgan.forward)
    kwargs: dict[str, Any] = {"max_mel_tokens": int(request["max_mel_tokens"]), "num_beams": 1}
    kwargs["max_text_tokens_per_segment"] = 600  # one segment, as the throughput cell asks
    if version == "2.5":
        kwargs["lang"] = "en"
    for _chunk in model.infer(
        spk_audio_prompt=request["voice"], text=request["text"], output_path=None, stream_return=True, **kwargs
    ):
        pass
    if not steps:
        raise SystemExit("no decoding step was seen: this upstream's GPT is not the one this script knows")
    layers, dim = int(gpt.layers), int(gpt.model_dim)
    kv_row = statistics.mean(2 * layers * dim * context * element for _rows, context in steps)
    read = machine["bandwidth"]["bytes_per_s"]
    throughput = machine["matmul"]["flops_per_s"]
    answers.write(
        json.dumps(
            {
                **machine,
                "gpt": {
                    "weight_bytes": weights,
                    "kv_bytes_per_row": kv_row,
                    "steps": len(steps),
                    "mean_context": statistics.mean(context for _rows, context in steps),
                    "step_s_by_rows": {str(rows): (weights + rows * kv_row) / read for rows in ROWS},
                },
                "s2mel": {"flops": flops["s2mel"], "calls": calls["s2mel"], "s": flops["s2mel"] / throughput},
                "vocoder": {"flops": flops["vocoder"], "calls": calls["vocoder"], "s": flops["vocoder"] / throughput},
            }
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
