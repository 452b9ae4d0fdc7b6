"""A server speaking the seed's protocol, for the baseline benchmark.

Written from the seed's description (../shared/seed/): length-prefixed JSON frames,
audio as base64 int16 in a JSON string, one request at a time with blocking reads on
stdin, and no request ids.  The audio is the fake engine's, with zero model time, so
what is measured is the protocol.  ``model_seconds`` in a request simulates inference
by sleeping, during which nothing else is read (as in the seed).
"""

from __future__ import annotations

import base64
import json
import struct
import sys
import time


def send(obj: dict[str, object]) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    sys.stdout.buffer.write(struct.pack("!I", len(body)) + body)
    sys.stdout.buffer.flush()


def receive() -> dict[str, object] | None:
    header = sys.stdin.buffer.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack("!I", header)
    return json.loads(sys.stdin.buffer.read(size))  # type: ignore[no-any-return]


def main() -> None:
    send({"op": "ready", "engine": "fake", "sample_rate": 24000})
    while (message := receive()) is not None:
        if message.get("op") == "ping":
            send({"op": "pong"})
        elif message.get("op") == "synthesize":
            from indextts_sidecar.engines.fake import render  # after ready, as the seed imports lazily

            time.sleep(float(message.get("model_seconds", 0)))  # type: ignore[arg-type]
            pcm = render(str(message["text"]), 24000, seconds=float(message["seconds"])).tobytes()  # type: ignore[arg-type]
            send(
                {
                    "op": "audio",
                    "audio_pcm_b64": base64.b64encode(pcm).decode("ascii"),
                    "sample_rate": 24000,
                    "n_samples": len(pcm) // 2,
                }
            )
        elif message.get("op") == "shutdown":
            return


if __name__ == "__main__":
    main()
