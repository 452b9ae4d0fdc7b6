"""The sidecar's sample-rate converters: stop-band attenuation, pass-band flatness, speed.

    .venv/bin/python bench/bench_resample.py [--rounds 5]

For each converter available here (soxr with the audio extra; torchaudio only where torch
is already loaded; numpy always), 22,050 -> 16,000 Hz, fed in 0.5 s chunks as an engine
yields them:

* attenuation of a 10 kHz tone (above the new Nyquist frequency, 8 kHz), in dB;
* gain at 7.2 kHz (0.9 of the new Nyquist frequency) and at 1 kHz, in dB;
* speed: seconds of audio converted per second of CPU, on 60 s of noise; the converters
  take turns, ``--rounds`` times (the order reversed every other round), and the speed is
  the median (min-max) over the rounds, with each round's ratio to the numpy converter
  (each converter converts one second once before the rounds).
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

import numpy as np

from indextts_sidecar._resample import available_methods, make_resampler

SOURCE, TARGET = 22050, 16000
CHUNK = SOURCE // 2


def convert(method: str, x: np.ndarray) -> np.ndarray:
    converter = make_resampler(SOURCE, TARGET, method)
    out = bytearray()
    for start in range(0, len(x), CHUNK):
        out += converter.feed(x[start : start + CHUNK].tobytes())
    out += converter.flush()
    return np.frombuffer(bytes(out), "<i2")


def tone(frequency: float, seconds: float = 2.0) -> np.ndarray:
    t = np.arange(int(SOURCE * seconds)) / SOURCE
    samples: np.ndarray = np.rint(16000 * np.sin(2 * np.pi * frequency * t)).astype("<i2")
    return samples


def level(y: np.ndarray, frequency: float) -> float:
    middle = y[len(y) // 4 : 3 * len(y) // 4].astype(np.float64)
    phase = 2 * np.pi * frequency * np.arange(len(middle)) / TARGET
    basis = np.stack([np.sin(phase), np.cos(phase)], axis=1)
    (a, b), *_ = np.linalg.lstsq(basis, middle, rcond=None)
    return float(np.hypot(a, b))


def speed(method: str, noise: np.ndarray) -> float:
    """Seconds of ``noise`` converted per second of CPU."""
    began = time.process_time()
    convert(method, noise)
    return len(noise) / SOURCE / (time.process_time() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    methods = available_methods()
    noise = (np.random.default_rng(1).standard_normal(SOURCE * 60) * 3000).astype("<i2")
    speeds: dict[str, list[float]] = {method: [] for method in methods}
    for method in methods:  # a converter's first use in a process sets it up: not what a sidecar pays per chunk
        convert(method, noise[:SOURCE])
    for number in range(rounds):
        for method in methods if number % 2 == 0 else list(reversed(methods)):
            speeds[method].append(speed(method, noise))
    print(f"CPython {platform.python_version()} on {platform.machine()}, {SOURCE} -> {TARGET} Hz, {rounds} rounds")
    print("| converter | 10 kHz tone | gain at 7.2 kHz | gain at 1 kHz | speed (x real time) | speed vs numpy |")
    print("|---|---|---|---|---|---|")
    for method in methods:
        stop = convert(method, tone(10000))
        middle = stop[len(stop) // 4 : 3 * len(stop) // 4].astype(np.float64)
        attenuation = 20 * math.log10((16000 / math.sqrt(2)) / max(math.sqrt(float(np.mean(middle**2))), 1e-9))
        gains = [20 * math.log10(level(convert(method, tone(f)), f) / 16000) for f in (7200.0, 1000.0)]
        mine = speeds[method]
        ratios = [a / b for a, b in zip(mine, speeds["numpy"], strict=True)]
        print(
            f"| {method} | -{attenuation:.1f} dB | {gains[0]:+.3f} dB | {gains[1]:+.3f} dB"
            f" | {statistics.median(mine):.0f}x ({min(mine):.0f}-{max(mine):.0f})"
            f" | {statistics.median(ratios):.1f} ({min(ratios):.1f}-{max(ratios):.1f}) |"
        )


if __name__ == "__main__":
    main()
