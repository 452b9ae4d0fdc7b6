"""examples/livekit_agent.py runs and prints what it promises (in the LiveKit venv)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("livekit.agents")
pytest.importorskip("uvicorn")

REPO = Path(__file__).resolve().parents[3]
TIMEOUT = 60


def test_livekit_example(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "livekit_agent.py"), "fake"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    lines = result.stdout.splitlines()
    sentences = ["Hello from a sidecar, through LiveKit.", "Each word is timed."]
    # the fake engine: 0.06 s (1440 samples at 24 kHz) a character, each word timed by its characters
    assert lines[0] == f"spoke {1440 * sum(map(len, sentences))} samples at 24000 Hz"
    words = [re.fullmatch(r" ?(\d+\.\d\d)- ?(\d+\.\d\d) s (\S+)", line) for line in lines[1:-1]]
    assert all(words), lines
    assert [m[3] for m in words if m] == " ".join(sentences).split()
    assert [m.group(1, 2) for m in words if m][:2] == [("0.00", "0.30"), ("0.36", "0.60")]
    assert lines[-1] == "interrupted after 1 frame"
