"""Per-call overhead of a Ray Serve deployment on one node against the same spread over two.

Runs in the Ray venv on a two-node cluster on this machine (``ray.cluster_utils.Cluster``:
a head node and a second node, each with its own raylet and object store)::

    PYTHONPATH=. $(python3 tests/upstream/build_venv.py ray) bench/bench_ray_nodes.py --rounds 7

Two deployments of two fake replicas each: "one node" has both on the head (they need a
``head_slot``, which only the head has), "two nodes" has one on each (they need a
``tts_slot``, one per node).  Round after round each takes ``--requests`` sequential tiny
requests (0.06 s of audio) through a RayClient in this process (a driver on the head),
the order alternating.  Prints per-call latency, median (min-max) over every call, and the
per-round ratio of the medians, two nodes over one.  Both nodes share this machine, so the
difference is Ray's path to a replica under another raylet, not a network's latency.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import anyio
import ray
from ray import serve
from ray.cluster_utils import Cluster

from indextts_client.ray import RayClient, deployment


async def main(args: argparse.Namespace) -> None:
    apps = {
        "one node": deployment("fake", num_replicas=2, num_cpus=0.25, resources={"head_slot": 1}, name="one"),
        "two nodes": deployment("fake", num_replicas=2, num_cpus=0.25, resources={"tts_slot": 1}, name="two"),
    }
    clients: dict[str, RayClient] = {}
    for label, app in apps.items():
        clients[label] = RayClient(serve.run(app, name=label.replace(" ", "-"), route_prefix=None))
    nodes: dict[str, set[str]] = {label: set() for label in clients}
    for label, client in clients.items():
        for _ in range(40):  # warm every path; see where the replicas are
            await client.synthesize("x")
            nodes[label].add((await client.ping())["node_id"])
    if [len(nodes[label]) for label in clients] != [1, 2]:
        raise SystemExit(f"the replicas are not where they should be: {nodes}")
    times: dict[str, list[float]] = {label: [] for label in clients}
    ratios = []
    for number in range(args.rounds):
        order = list(clients.items())
        if number % 2:
            order.reverse()
        medians = {}
        for label, client in order:
            this = []
            for _ in range(args.requests):
                started = time.perf_counter()
                await client.synthesize("x")
                this.append(time.perf_counter() - started)
            times[label].extend(this)
            medians[label] = statistics.median(this)
        ratios.append(medians["two nodes"] / medians["one node"])

    def fmt(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:.2f} ms ({min(values) * 1000:.2f}-{max(values) * 1000:.2f})"

    print(f"{args.rounds} rounds x {args.requests} sequential requests each, 2 replicas per deployment:")
    for label in clients:
        print(f"  {label:<9}  replicas on {len(nodes[label])} node(s)  per call {fmt(times[label])}")
    print(f"  two nodes / one node, per round: {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


def start(args: argparse.Namespace) -> Any:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"head_slot": 2, "tts_slot": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=2, resources={"tts_slot": 1})
    cluster.wait_for_nodes()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": root}})
    serve.start(proxy_location="Disabled")
    return cluster


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    cluster = start(args)
    try:
        anyio.run(main, args)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
