"""The floor: a child that answers each 4-byte request with a length prefix and raw PCM.

No codec, no framing beyond the length, no event loop: the cost of moving the bytes
between two processes and into a numpy array, which no protocol can beat.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys

from indextts_sidecar.engines.fake import render

# The same pipe size as the sidecar's (_fds.py): the floor moves bytes as fast as it can.
try:
    fcntl.fcntl(1, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1024 * 1024)
except OSError:
    pass
cache: dict[int, bytes] = {}
stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
stdout.write(b"R")
stdout.flush()
while len(request := stdin.read(4)) == 4:
    (millis,) = struct.unpack("!I", request)
    pcm = cache.get(millis)
    if pcm is None:
        pcm = cache[millis] = render("floor", 24000, seconds=millis / 1000).tobytes()
    os.write(1, struct.pack("!I", len(pcm)))
    view = memoryview(pcm)
    while view:
        view = view[os.write(1, view) :]
