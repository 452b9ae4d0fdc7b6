"""examples/pipecat_agent.py runs and prints what it promises (the fake engine: 1440 samples a
character at 24 kHz, each word timed from its first character)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pipecat.frames.frames", reason="pipecat-ai is not installed: `bash .ci/agents` runs it")

REPO = Path(__file__).resolve().parents[3]
TEXT = "Hello from a sidecar, through Pipecat."


def test_the_example_speaks_a_turn_with_its_words_then_is_interrupted(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "pipecat_agent.py"), "fake"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    words, at = [], 0
    for word in TEXT.split():
        words.append(f"{word}@{at * 1440 / 24000:.2f}")
        at += len(word) + 1
    assert result.stdout.splitlines() == [
        f"spoke {1440 * len(TEXT)} samples at 24000 Hz",
        "words: " + " ".join(words),
        "interrupted after 12000 samples",
    ]
    assert "DeprecationWarning" not in result.stderr, result.stderr
