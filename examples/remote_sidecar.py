"""One sidecar, several clients, over a Unix socket with a token; a voice uploaded by one of them.

::

    python examples/remote_sidecar.py

Starts ``python -m indextts_sidecar --engine fake --listen unix:///...`` in a temporary
directory (in production: a service on the GPU machine, ``--listen tcp://HOST:PORT`` with
``--tls-cert``/``--tls-key``), reads the address it prints, and connects two clients to it.
Each has its own requests; the sidecar serves them in turn on its one engine.
"""

from __future__ import annotations

import io
import math
import secrets
import struct
import subprocess
import sys
import tempfile
import wave
from pathlib import Path
from typing import Union

import anyio

from indextts_client import AuthenticationError, Client


def _reference_clip() -> bytes:
    """Half a second of a 220 Hz tone as WAV (the sidecar decodes every clip it is sent)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes(
            b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 220 * i / 16000))) for i in range(8000))
        )
    return out.getvalue()


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tts-") as tmp:
        directory = Path(tmp)
        token = secrets.token_urlsafe(32)
        (directory / "token").write_text(token + "\n")
        (directory / "voices").mkdir()
        command = [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", "--log-level", "WARNING"]
        command += ["--listen", f"unix://{directory}/tts.sock", "--token-file", str(directory / "token")]
        command += ["--voice-dir", str(directory / "voices")]
        sidecar = await anyio.open_process(command, stdin=subprocess.DEVNULL, stderr=None)
        try:
            assert sidecar.stdout is not None
            line = b""
            while not line.endswith(b"\n"):  # "listening on unix:///.../tts.sock"
                line += await sidecar.stdout.receive(1)
            url = line.decode().split()[-1]
            print(f"sidecar {line.decode().strip()}")

            try:
                async with Client(url=url, token="not the token, but long enough"):
                    pass
            except AuthenticationError as exc:
                print(f"wrong token: {type(exc).__name__}: {exc.message}")

            async with Client(url=url, token=token) as alice, Client(url=url, token=token) as bob:
                voice = await alice.register_voice("alice", _reference_clip())  # a clip's bytes
                print(f"registered: {voice}")
                results: dict[str, float] = {}

                async def speak(name: str, client: Client, voice: Union[str, None]) -> None:
                    audio = await client.synthesize(f"Hello from {name}.", voice=voice)
                    results[name] = audio.duration

                async with anyio.create_task_group() as tg:
                    tg.start_soon(speak, "alice", alice, voice)
                    tg.start_soon(speak, "bob", bob, None)
                for name in sorted(results):
                    print(f"{name}: {results[name]:.2f} s of audio")
                print(f"same sidecar: {alice.info.pid == bob.info.pid}")
        finally:
            if sidecar.returncode is None:
                sidecar.terminate()  # SIGTERM: the sidecar ends its connections and exits 0
            print(f"sidecar exit code: {await sidecar.wait()}")
            await sidecar.aclose()


if __name__ == "__main__":
    anyio.run(main)
