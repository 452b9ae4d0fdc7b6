"""Upstream's ``IndexTTS2.infer`` called directly in this process: the yardstick of bench_gpu's ``overhead`` cell.

Runs in upstream's venv (``INDEXTTS_UPSTREAM_PYTHON``), with the GitHub checkout and this
repository on ``PYTHONPATH``::

    python bench/_upstream_direct.py 2|2.5 MODEL_DIR DEVICE

Loads the model as the sidecar's adapter does (the same constructor keywords: no Qwen, the
auxiliary models of ``MODEL_DIR/hf_cache``, handed over where the constructor takes them),
then reads one JSON request a line on stdin
(``text``, ``voice``, ``max_mel_tokens``) and answers each with one JSON line: the wall
seconds of ``infer(..., stream_return=True)`` consumed to its end, and the samples it gave.
Upstream prints to stdout, so its prints go to stderr and the answers to the stdout this
process was given.  OpenMP's idle threads wait as in the sidecar (``openmp_waits``: a bounded
spin unless the environment says otherwise), so that the ``overhead`` cell compares the paths,
not two wait policies; the ready line says which setting was in effect.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import time
from typing import Any

from indextts_sidecar.engines.indextts._install import aux_paths
from indextts_sidecar.engines.indextts._upstream import openmp_waits


def load_model(version: str, model_dir: str, device: str) -> Any:
    """Upstream's ``IndexTTS2`` as the adapter constructs it (also ``_floor.py``'s)."""
    module = importlib.import_module("indextts.infer_v2_5" if version == "2.5" else "indextts.infer_v2")
    kwargs = {"cfg_path": os.path.join(model_dir, "config.yaml"), "model_dir": model_dir, "device": device}
    accepted = inspect.signature(module.IndexTTS2.__init__).parameters
    if "aux_paths" in accepted:  # 2.5 reads <model_dir>/hf_cache by itself
        kwargs["aux_paths"] = aux_paths(model_dir)
    return module.IndexTTS2(use_qwen_emo=False, **kwargs)


def main() -> int:
    version, model_dir, device = sys.argv[1:4]
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # upstream's prints
    sys.stdout = sys.stderr
    openmp = openmp_waits()  # before upstream imports torch
    model = load_model(version, model_dir, device)
    answers.write(json.dumps({"ready": True, "openmp": openmp}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        kwargs = {"max_mel_tokens": int(request["max_mel_tokens"])}
        if version == "2.5":
            kwargs["lang"] = "en"
        started = time.perf_counter()
        samples = 0
        chunks = model.infer(
            spk_audio_prompt=request["voice"], text=request["text"], output_path=None, stream_return=True, **kwargs
        )
        for chunk in chunks:
            if hasattr(chunk, "shape"):
                samples += int(chunk.shape[-1])
        wall = time.perf_counter() - started
        answers.write(json.dumps({"wall": wall, "samples": samples}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
