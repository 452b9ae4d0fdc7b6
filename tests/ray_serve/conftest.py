"""The Ray cluster the suite runs on.

``bash .ci/ray`` starts a head node and a second node on this machine and passes their
address (``RAY_ADDRESS``) and the second node's process group
(``INDEXTTS_RAY_SECOND_NODE_PGID``); the suite connects to them.  Run by hand without
them, it starts a one-node local cluster, and the tests that need two nodes skip, saying why.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ray_support import ROOT, SECOND_NODE, TIMEOUT


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Ray's handles run on asyncio only; the trio path has its own test


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict[str, Any]]:
    """``{"http_port": ..., "nodes": n}``: Ray connected, Serve started, its proxy on the head only."""
    ray = pytest.importorskip("ray", reason="Ray is not installed here: `bash .ci/ray` runs these tests in a Ray venv")
    from ray import serve

    # Workers import indextts_client from this checkout.
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    runtime_env = {"env_vars": {"PYTHONPATH": path}}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env)
        wanted = 2 if SECOND_NODE else 1
        deadline = time.monotonic() + TIMEOUT
        # The second node joins on its own: a bounded poll of the cluster's state.
        while sum(1 for n in ray.nodes() if n["Alive"]) < wanted:
            assert time.monotonic() < deadline, f"the cluster has not {wanted} nodes: {ray.nodes()}"
            time.sleep(0.2)
    else:
        ray.init(num_cpus=2, include_dashboard=False, runtime_env=runtime_env)
    with socket.socket() as probe:  # a free loopback port for Serve's HTTP proxy
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # One proxy, on the head: two on one machine would want the same port.
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    try:
        yield {"http_port": port, "nodes": sum(1 for n in ray.nodes() if n["Alive"])}
    finally:
        serve.shutdown()
        ray.shutdown()
