"""The real-time examples run and print what they promise (Pipecat and LiveKit only where installed)."""

from __future__ import annotations

import os
import subprocess
import sys
import wave
from pathlib import Path

from indextts_sidecar.engines.fake import render_bytes

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TIMEOUT = 60


def run_example(name: str, *args: str, cwd: Path, stderr: list[str] | None = None) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, f"{name} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    if stderr is not None:
        stderr.append(result.stderr)
    return result.stdout


def test_stream_text_example(tmp_path: Path) -> None:
    out = run_example("stream_text.py", "fake", "answer.wav", cwd=tmp_path)
    sentences = [
        "Sure.",
        "The museum opens at nine.",
        "Tickets are twelve euros, and children go free.",
        "Enjoy your visit!",
    ]
    assert out.splitlines() == [f"sentence {i}: {s!r}" for i, s in enumerate(sentences)] + [
        "interrupted in sentence 1; wrote answer.wav"
    ]
    with wave.open(str(tmp_path / "answer.wav"), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)
        assert wav.readframes(wav.getnframes()) == b"".join(render_bytes(s) for s in sentences)


# The Pipecat and LiveKit examples (examples/pipecat_agent.py, examples/livekit_agent.py) run on
# the project's own services and are tested in each framework's venv: tests/agents/<framework>/
# (bash .ci/agents).
