"""examples/pipecat_agent.py runs and prints what it promises (the fake engine: 1440 samples a
character at 24 kHz, each word timed from its first character), and ends at once, with one line
saying why, when its engine cannot load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pipecat.frames.frames", reason="pipecat-ai is not installed: `bash .ci/agents` runs it")

REPO = Path(__file__).resolve().parents[3]
#: An engine that cannot load ends the example at once, not after its 60 s wait for the server's
#: ready: it took 2-5 s here on two idle cores, and this bound is 10 times that, under the 60 s.
ENDS_WITHIN = 40
TEXT = "Hello from a sidecar, through Pipecat."


def _run(tmp_path: Path, engine: str, *, without: str = "", timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    paths = [str(REPO / "tests" / "without_extras")] if without else []  # hides the modules named in without
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["INDEXTTS_TEST_WITHOUT"] = without
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / "pipecat_agent.py"), engine],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_example_speaks_a_turn_with_its_words_then_is_interrupted(tmp_path: Path) -> None:
    result = _run(tmp_path, "fake")
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


@pytest.mark.parametrize(
    ("engine", "without", "reason"),
    [
        ("espeak", "espeakng_loader", "install the [espeak] extra"),  # a venv without the espeak extra
        ("nope", "", "unknown engine 'nope'"),
    ],
)
def test_an_engine_that_cannot_load_ends_it_before_its_ready_wait(
    tmp_path: Path, engine: str, without: str, reason: str
) -> None:
    result = _run(tmp_path, engine, without=without, timeout=ENDS_WITHIN)
    assert result.returncode == 1, f"{result.stdout}\n{result.stderr}"
    assert result.stdout == ""
    [line] = [line for line in result.stderr.splitlines() if line.startswith("pipecat_agent:")]
    assert line.startswith("pipecat_agent: the engine could not start: ") and reason in line, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
