#!/usr/bin/env bash
# bench_gpu.py at full model size on a bare GPU machine that has torch but no registry access.
#
#   bash bench/gpu_run.sh pack     # here, with PyPI: fills .device/ (ignored by git), <= 60 MiB
#   bash bench/gpu_run.sh device   # there, from the repository root, .device carried; writes $OUT
#
# The device tool's call (one call, timeout 600 s; the run itself stops starting cells at
# BENCH_BUDGET seconds, 420 by default, and is killed at 540):
#   run(command="bash bench/gpu_run.sh device", carry=[".device"], timeout_s=600)
# It writes $OUT/bench_gpu.json (every cell, measured or skipped with the reason, saved after
# each cell), $OUT/bench_gpu.log (the run's output with the table) and $OUT/nvidia-smi.txt.
# Options after `device` go to bench_gpu.py: issue 33's cells alone (batching, the sidecar's
# price, MPS), so that the budget is not spent on the others first:
#   run(command="bash bench/gpu_run.sh device --cells batch,overhead,mps", carry=[".device"], timeout_s=600)
#
# What travels (.device/, built by `pack`):
#   wheels/    the packages upstream imports that the machine's image lacks (cp312 wheels at
#              the versions of tests/upstream/pins-github.txt), transformers 4.52.1 among them:
#              upstream cannot run on the image's transformers 5.
#   index-tts/ a copy of the upstream checkout's indextts/ package (INDEXTTS_UPSTREAM_SRC), as
#              the sidecar imports it; never committed.
#   stubs/     bench/device/stubs: wetext in place of WeTextProcessing's pynini (165 MB, over the
#              carry limit; upstream's own macOS/Windows path) and a fugashi without a Japanese
#              dictionary (the benchmark speaks English).
# torch, numpy, triton, safetensors, tokenizers' neighbours... are the image's own (torch 2.11
# where upstream pins 2.8): the run records the versions it found.
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE_DIR=.device
LIMIT_MIB=60
#: Distributions upstream imports (found by running it) that the machine's image lacks, or has at
#: a version upstream cannot use; versions from pins-github.txt.
WANTED="transformers tokenizers huggingface_hub accelerate omegaconf modelscope
librosa soundfile soxr audioread pooch platformdirs decorator cffi pycparser munch openai-whisper
more-itertools descript-audiotools argbind docstring_parser ffmpy flatten-dict julius randomname
fire termcolor importlib_resources anyio msgspec wetext kaldifst contractions textsearch anyascii pyahocorasick"

pin() {  # the version pins-github.txt gives NAME, or nothing
    { grep -i -E "^$(echo "$1" | sed 's/[-_.]/[-_.]/g')==" tests/upstream/pins-github.txt || true; } | head -1 | cut -d= -f3
}

pack() {
    local src=${INDEXTTS_UPSTREAM_SRC:-$(cd .. && pwd)/shared/upstream/index-tts}
    [ -f "$src/indextts/infer_v2.py" ] || { echo "no upstream checkout at $src (set INDEXTTS_UPSTREAM_SRC)" >&2; exit 2; }
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx "/$DEVICE_DIR/" "$exclude" 2>/dev/null || echo "/$DEVICE_DIR/" >> "$exclude"
    # Wheels already there are kept (pip takes a downloaded file as it is); the rest is made afresh.
    rm -rf "$DEVICE_DIR/index-tts" "$DEVICE_DIR/stubs" && mkdir -p "$DEVICE_DIR/wheels" "$DEVICE_DIR/index-tts"
    local platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
    for name in $WANTED; do
        local version spec
        version=$(pin "$name")
        spec=$name${version:+==$version}
        # shellcheck disable=SC2086
        if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
                $platforms -d "$DEVICE_DIR/wheels" "$spec" 2>/dev/null; then
            # Pure-Python projects published as source only (antlr4, openai-whisper...): build the wheel here.
            python3 -m pip wheel -q --no-deps -w "$DEVICE_DIR/wheels" "$spec"
        fi
    done
    if ls "$DEVICE_DIR"/wheels/*.whl | grep -v -E 'none-any|-none-manylinux|cp312|abi3' >&2; then
        echo "a wheel above was built for this machine's Python, not the device's 3.12" >&2; exit 1
    fi
    cp -r "$src/indextts" "$DEVICE_DIR/index-tts/indextts"
    cp "$src"/SNAPSHOT.txt "$DEVICE_DIR/index-tts/" 2>/dev/null || git -C "$src" rev-parse HEAD > "$DEVICE_DIR/index-tts/COMMIT" || true
    find "$DEVICE_DIR/index-tts" \( -name __pycache__ -o -name tagger_cache \) -prune -exec rm -rf {} +
    cp -r bench/device/stubs "$DEVICE_DIR/stubs"
    local size
    size=$(du -sm "$DEVICE_DIR" | cut -f1)
    echo "packed $DEVICE_DIR: ${size} MiB ($(ls "$DEVICE_DIR/wheels" | wc -l) wheels)"
    [ "$size" -le "$LIMIT_MIB" ] || { echo "over ${LIMIT_MIB} MiB: the device call carries 64 MiB in all" >&2; exit 1; }
}

device() {
    : "${OUT:?run this on the device machine, where OUT is set}"
    [ -d "$DEVICE_DIR/wheels" ] || { echo "no $DEVICE_DIR: run 'bash bench/gpu_run.sh pack' here and carry it" >&2; exit 2; }
    local started=$SECONDS
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$DEVICE_DIR"/wheels/*.whl
    export PYTHONPATH="$PWD/$DEVICE_DIR/stubs:/tmp/site:$PWD"
    export INDEXTTS_UPSTREAM_PYTHON=$(command -v python3)
    export INDEXTTS_UPSTREAM_SRC="$PWD/$DEVICE_DIR/index-tts"
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
    python3 -c 'import torch, transformers, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
        "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "transformers", transformers.__version__)' \
        2>&1 | tee "$OUT/bench_gpu.log"
    echo "set up in $(( SECONDS - started )) s" | tee -a "$OUT/bench_gpu.log"
    set +e
    timeout 540 python3 bench/bench_gpu.py --device cuda:0 --budget "${BENCH_BUDGET:-420}" \
        --ckpt-root /tmp/bench-gpu-ckpts --out "$OUT/bench_gpu.json" "$@" 2>&1 | tee -a "$OUT/bench_gpu.log"
    local status=${PIPESTATUS[0]}
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$OUT/nvidia-smi.txt" 2>&1 || true
    echo "bench_gpu.py exit status $status after $(( SECONDS - started )) s" | tee -a "$OUT/bench_gpu.log"
    exit "$status"
}

case "${1:-}" in
    pack) shift; pack "$@" ;;
    device) shift; device "$@" ;;
    *) echo "usage: bash bench/gpu_run.sh pack|device [bench_gpu.py options]" >&2; exit 2 ;;
esac
