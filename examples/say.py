"""Speak a sentence with the espeak engine and write it to a WAV file.

Run it from an environment where ``indextts-sidecar[espeak]`` is installed::

    python examples/say.py                 # writes hello.wav
    python examples/say.py out.wav "Some other text."
"""

from __future__ import annotations

import sys

import anyio

from indextts_client import Client


async def main(path: str, text: str) -> None:
    async with Client("espeak") as client:
        audio = await client.synthesize(text)
    audio.to_wav(path)
    print(f"wrote {path}: {len(audio)} samples at {audio.sample_rate} Hz ({audio.duration:.2f} s)")


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "hello.wav"
    text = sys.argv[2] if len(sys.argv) > 2 else "Hello from a sidecar."
    anyio.run(main, path, text)
