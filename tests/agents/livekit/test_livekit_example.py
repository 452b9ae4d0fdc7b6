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
#: An engine that cannot load ends the example at once, not after its 60 s wait for the server's
#: ready: it took 2-5 s here on two idle cores, and this bound is 10 times that, under the 60 s.
ENDS_WITHIN = 40
TIMEOUT = 60


def _run(
    tmp_path: Path, engine: str, *, without: str = "", timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    paths = [str(REPO / "tests" / "without_extras")] if without else []  # hides the modules named in without
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["INDEXTTS_TEST_WITHOUT"] = without
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / "livekit_agent.py"), engine],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_livekit_example(tmp_path: Path) -> None:
    result = _run(tmp_path, "fake")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    # It spoke once the server was ready: no refused handshake, nothing retried.
    assert "503" not in result.stderr and "retrying" not in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    sentences = ["Hello from a sidecar, through LiveKit.", "Each word is timed."]
    # the fake engine: 0.06 s (1440 samples at 24 kHz) a character, each word timed by its characters
    assert lines[0] == f"spoke {1440 * sum(map(len, sentences))} samples at 24000 Hz"
    words = [re.fullmatch(r" ?(\d+\.\d\d)- ?(\d+\.\d\d) s (\S+)", line) for line in lines[1:-1]]
    assert all(words), lines
    assert [m[3] for m in words if m] == " ".join(sentences).split()
    assert [m.group(1, 2) for m in words if m][:2] == [("0.00", "0.30"), ("0.36", "0.60")]
    assert lines[-1] == "interrupted after 1 frame"


def test_an_engine_that_cannot_load_ends_it_before_its_ready_wait(tmp_path: Path) -> None:
    result = _run(tmp_path, "espeak", without="espeakng_loader", timeout=ENDS_WITHIN)  # a venv without the espeak extra
    assert result.returncode == 1, f"{result.stdout}\n{result.stderr}"
    assert result.stdout == ""
    assert result.stderr.startswith("livekit_agent: the engine could not start: "), result.stderr
    assert "install the [espeak] extra" in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
