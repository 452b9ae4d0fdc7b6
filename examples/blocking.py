"""The same API without async, for scripts and notebooks: BlockingClient.

Run it from an environment where ``indextts-sidecar[espeak]`` is installed (add the
``audio`` extra for .flac or .ogg)::

    python examples/blocking.py                 # writes hello.wav
    python examples/blocking.py hello.flac
"""

from __future__ import annotations

import sys

from indextts_client import BlockingClient


def main(path: str) -> None:
    with BlockingClient("espeak") as client:
        english = [voice["name"] for voice in client.voices() if "en-us" in voice["languages"]]
        print(f"voices for en-us: {', '.join(english)}")
        audio = client.synthesize("Hello from a script.", voice="en-us")
        with client.stream("One. Two. Three.") as chunks:
            for chunk in chunks:
                print(f"chunk {chunk.seq}: {len(chunk)} samples")
    audio.to_file(path)
    print(f"wrote {path}: {len(audio)} samples at {audio.sample_rate} Hz ({audio.duration:.2f} s)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "hello.wav")
