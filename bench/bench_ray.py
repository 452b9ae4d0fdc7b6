"""Per-request overhead of Ray Serve (RayClient over a deployment handle) against a direct Client.

Runs in the Ray venv (``bash .ci/ray`` builds it), on a local cluster, with one fake
replica and one direct fake sidecar, requests alternating between the two, round after
round::

    PYTHONPATH=. $(python3 tests/upstream/build_venv.py ray) bench/bench_ray.py --rounds 5

Prints per-request latency (median, min-max) of a tiny request (0.06 s of audio) for both,
and the difference: what Ray Serve adds per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import anyio
import ray
from ray import serve

from indextts_client import Client
from indextts_client.ray import RayClient, deployment


async def main(args: argparse.Namespace) -> None:
    handle = serve.run(deployment("fake", num_replicas=1, num_cpus=0.5), name="bench", route_prefix=None)
    remote = RayClient(handle)
    times: dict[str, list[float]] = {"direct": [], "ray": []}
    async with Client("fake") as direct:
        for c in (remote, direct):
            for _ in range(20):  # warm both paths
                await c.synthesize("x")
        for number in range(args.rounds):
            order = [("direct", direct), ("ray", remote)]
            if number % 2:
                order.reverse()
            for label, c in order:
                for _ in range(args.requests):
                    started = time.perf_counter()
                    await c.synthesize("x")
                    times[label].append(time.perf_counter() - started)

    def fmt(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:.2f} ms ({min(values) * 1000:.2f}-{max(values) * 1000:.2f})"

    print(f"{args.rounds} rounds x {args.requests} sequential requests each:")
    print(f"  direct Client        {fmt(times['direct'])}")
    print(f"  RayClient via Serve  {fmt(times['ray'])}")
    added = statistics.median(times["ray"]) - statistics.median(times["direct"])
    print(f"  Ray Serve adds {added * 1000:.2f} ms per request (difference of medians)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": root}})
    try:
        anyio.run(main, args)
    finally:
        serve.shutdown()
        ray.shutdown()
