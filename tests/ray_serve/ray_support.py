"""What the Ray Serve tests share: paths, bounds, the cluster .ci/ray started."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 120
#: The second node's process group, when .ci/ray started a two-node cluster (else None).
SECOND_NODE = os.environ.get("INDEXTTS_RAY_SECOND_NODE_PGID")
