"""The sidecar's path policy for voice and emotion clips (`_paths.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from client_support import expected, fake_client

from indextts_client import InvalidRequestError

pytestmark = pytest.mark.anyio


async def test_the_path_policy(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    inside = voices / "ok.wav"
    inside.write_bytes(b"x" * 100)
    big = voices / "big.wav"
    with open(big, "wb") as f:  # sparse: 10 GB of nothing
        f.truncate(10 * 1024**3)
    outside = tmp_path / "outside.wav"
    outside.write_bytes(b"x")
    (voices / "link.wav").symlink_to(outside)
    fifo = voices / "fifo.wav"
    os.mkfifo(fifo)
    cases = [
        (str(outside), "outside the allowed directories"),
        (str(voices / ".." / "outside.wav"), "outside the allowed directories"),
        (str(voices / "link.wav"), "outside the allowed directories"),
        (str(fifo), "not a regular file"),
        (str(voices), "is a directory"),
        (str(big), "more than the limit of 10485760 (--max-voice-bytes)"),
        (str(voices / "none.wav"), "does not exist"),
    ]
    with anyio.fail_after(30):
        async with fake_client(sidecar_args=["--voice-dir", str(voices)]) as client:
            for path, fragment in cases:
                for kwargs, field in (
                    ({"voice": path}, "$.voice"),
                    ({"emotion": {"kind": "audio", "path": path}}, "$.emotion.path"),
                ):
                    with pytest.raises(InvalidRequestError) as caught:
                        await client.synthesize("x", **kwargs)
                    assert caught.value.code == "invalid_input" and caught.value.detail["field"] == field
                    assert fragment in caught.value.message, (path, caught.value.message)
            assert (await client.synthesize("x", voice=str(inside))).samples.tobytes() == expected("x")
        async with fake_client() as client:  # no allow-list: special files are still refused
            for path, fragment in (("/proc/self/mem", "special file"), ("/dev/zero", "special file")):
                with pytest.raises(InvalidRequestError) as caught:
                    await client.synthesize("x", voice=path)
                assert fragment in caught.value.message
            assert (await client.synthesize("x", voice=str(outside))).samples.tobytes() == expected("x")
