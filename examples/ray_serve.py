"""Sidecars as Ray Serve replicas, driven through RayClient (needs the [ray] extra).

    python examples/ray_serve.py [ENGINE] [REPLICAS]    (default: espeak, 2)

On a cluster, ``deployment("indextts2", num_replicas=8, num_gpus=1, python=ENGINE_PYTHON,
engine_options=...)`` runs one sidecar per GPU wherever Ray has one.
"""

from __future__ import annotations

import os
import sys

import anyio
import ray
from ray import serve

from indextts_client.ray import RayClient, deployment


async def main(handle: object) -> None:
    client = RayClient(handle)
    audio = await client.synthesize("Hello from a Ray Serve replica.")
    print(f"{audio.duration:.2f} s of audio at {audio.sample_rate} Hz")
    async with client.stream("And this one is streamed, chunk by chunk.") as chunks:
        async for chunk in chunks:
            print(f"chunk {chunk.seq}: {len(chunk.samples)} samples")


if __name__ == "__main__":
    engine = sys.argv[1] if len(sys.argv) > 1 else "espeak"
    replicas = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": root}})
    try:
        handle = serve.run(deployment(engine, num_replicas=replicas, num_cpus=0.5), name="example", route_prefix=None)
        anyio.run(main, handle)
    finally:
        serve.shutdown()
        ray.shutdown()
