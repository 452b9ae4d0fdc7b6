"""How torch's OpenMP threads wait, on a CPU that is quiet and on one with a core busy elsewhere.

One IndexTTS sidecar on the tiny fixture (``tests/upstream/fixture.py 2 DIR``), a greedy
request of the medium text (29 GPT tokens), timed after a warm-up, under three settings of the
sidecar's environment:

* ``libgomp default``: ``GOMP_SPINCOUNT=300000``, libgomp's own spin count (what torch's Linux
  wheels did before the sidecar set one);
* ``sidecar default``: nothing set, so the sidecar sets ``GOMP_SPINCOUNT=1000``
  (``engines/indextts/_upstream.openmp_waits``);
* ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep at once).

each with the machine quiet and with one core kept busy by another process (a Python busy
loop: the parent app, a second sidecar, a test suite).  Rounds interleave every setting and
state, the order rotating; it prints the median request time (min-max) of each, and each
setting's time over the sidecar default's, quiet and busy::

    INDEXTTS_UPSTREAM_PYTHON=$(python3 tests/upstream/build_venv.py github)
    $INDEXTTS_UPSTREAM_PYTHON tests/upstream/fixture.py 2 CKPT --src ../shared/upstream/index-tts
    INDEXTTS_UPSTREAM_PYTHON=$INDEXTTS_UPSTREAM_PYTHON .venv/bin/python bench/bench_openmp_wait.py CKPT --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio
from _upstream_env import upstream_env

from indextts_client import Client

ROOT = Path(__file__).resolve().parent.parent
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs back to the woods."
SETTINGS = {
    "libgomp default": {"GOMP_SPINCOUNT": "300000"},
    "sidecar default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
}
#: A request's bound: with libgomp's spin count and a busy core, a tiny request took 31 s here.
REQUEST_TIMEOUT = 600.0


async def timed(python: str, src: str, ckpt: str, extra_env: dict[str, str], requests: int) -> list[float]:
    """``requests`` greedy requests in one warmed-up sidecar with ``extra_env``: their seconds."""
    env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT), src]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        **extra_env,
    }
    options = {"model_dir": ckpt, "device": "cpu", "use_qwen_emo": False}
    voice = str(Path(ckpt) / "voice.wav")
    async with Client("indextts2", python=python, engine_options=options, env=env, ready_timeout=120) as client:
        info = await client.load()
        expected = extra_env or {"GOMP_SPINCOUNT": "1000"}
        if info.get("openmp") != expected:
            raise SystemExit(f"the sidecar's OpenMP waits are {info.get('openmp')}, not {expected}")
        await client.synthesize(TEXT, voice=voice, max_mel_tokens=29, do_sample=False, timeout=REQUEST_TIMEOUT)
        times = []
        for _ in range(requests):
            started = time.perf_counter()
            await client.synthesize(TEXT, voice=voice, max_mel_tokens=29, do_sample=False, timeout=REQUEST_TIMEOUT)
            times.append(time.perf_counter() - started)
        return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", help="a tiny IndexTTS-2 fixture (tests/upstream/fixture.py 2 DIR)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2, help="timed requests per sidecar and round")
    args = parser.parse_args()
    found = upstream_env()
    if found is None:
        return 2
    python, src = found
    runs = [(name, busy) for busy in (False, True) for name in SETTINGS]
    times: dict[tuple[str, bool], list[float]] = {run: [] for run in runs}
    for number in range(args.rounds):
        shift = number % len(runs)
        for name, busy in runs[shift:] + runs[:shift]:
            load = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                times[(name, busy)] += anyio.run(timed, python, src, args.ckpt, SETTINGS[name], args.requests)
            finally:
                if load is not None:
                    load.kill()
                    load.wait()
            print(f"round {number} {name} {'busy' if busy else 'quiet'}: {times[(name, busy)][-1]:.2f} s", flush=True)
    print(f"\n{os.cpu_count()} CPUs, {args.rounds} rounds x {args.requests} requests; seconds a request")
    print(f"{'setting':16} {'quiet':>22} {'one core busy':>22}   over the sidecar default (quiet, busy)")
    for name in SETTINGS:
        cells = []
        ratios = []
        for busy in (False, True):
            values = times[(name, busy)]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
            ratios.append(statistics.median(values) / statistics.median(times[("sidecar default", busy)]))
        print(f"{name:16} {cells[0]:>22} {cells[1]:>22}   {ratios[0]:.2f}, {ratios[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
