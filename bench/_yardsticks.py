"""The yardsticks the bench scripts measure this project against, each a blocking parent.

* :class:`SeedParent`: the seed's protocol (length-prefixed JSON, base64 audio) against
  ``_seed_protocol_server.py``, as the seed's own parent speaks it;
* :class:`FloorParent`: the raw-pipe floor, a length prefix and then ``readinto`` a numpy
  array, against ``_raw_pipe_server.py``;
* :func:`spawn_server`: one of this directory's servers on unbuffered pipes (the floors').
"""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
from typing import Any

import numpy as np
from _checkouts import REPO, checkout_env

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = checkout_env(REPO)


class SeedParent:
    """A parent speaking the seed's protocol: JSON + base64 over blocking pipes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_seed_protocol_server.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=ENV,
        )
        assert self.receive()["op"] == "ready"

    def send(self, obj: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        body = json.dumps(obj).encode()
        self.process.stdin.write(struct.pack("!I", len(body)) + body)
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        (size,) = struct.unpack("!I", self.process.stdout.read(4))
        return json.loads(self.process.stdout.read(size))  # type: ignore[no-any-return]

    def synthesize(self, seconds: float, model_seconds: float = 0.0) -> np.ndarray:
        self.send({"op": "synthesize", "text": "benchmark", "seconds": seconds, "model_seconds": model_seconds})
        reply = self.receive()
        return np.frombuffer(base64.b64decode(reply["audio_pcm_b64"]), dtype="<i2")

    def close(self) -> None:
        self.send({"op": "shutdown"})
        self.process.wait(10)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


def spawn_server(script: str) -> subprocess.Popen[bytes]:
    """Start one of this directory's servers on unbuffered pipes; returns once it wrote its ``R``."""
    process = subprocess.Popen(
        [sys.executable, os.path.join(HERE, script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=ENV,
        bufsize=0,
    )
    assert process.stdout is not None and process.stdout.read(1) == b"R"
    return process


class FloorParent:
    """A blocking parent of the raw-pipe child: a length prefix, then ``readinto`` a numpy array."""

    def __init__(self) -> None:
        self.process = spawn_server("_raw_pipe_server.py")
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout

    def request(self, seconds: float) -> np.ndarray:
        self.stdin.write(struct.pack("!I", int(seconds * 1000)))
        (size,) = struct.unpack("!I", self.stdout.read(4))
        out = np.empty(size // 2, dtype="<i2")
        view = memoryview(out).cast("B")
        got = 0
        while got < size:
            got += self.stdout.readinto(view[got:])  # type: ignore[operator]
        return out

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(10)
        self.stdout.close()
