"""`indextts-client say`: a real sidecar behind the command line."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
from harness import REPO

from indextts_sidecar.engines.fake import render_bytes


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "indextts_client", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def _samples(path: Path) -> tuple[int, np.ndarray]:
    with wave.open(str(path), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        return wav.getframerate(), np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")


def test_say_writes_exactly_the_engines_audio(tmp_path: Path) -> None:
    out = tmp_path / "fake.wav"
    result = _cli("say", "hello there", "-o", str(out), "--engine", "fake", "--option", "sample_rate=16000", "-q")
    assert result.returncode == 0, result.stderr
    rate, samples = _samples(out)
    assert rate == 16000
    assert samples.tobytes() == render_bytes("hello there", 16000)


def test_say_reads_text_from_stdin_and_passes_request_options(tmp_path: Path) -> None:
    out = tmp_path / "stdin.wav"
    result = _cli("say", "-", "-o", str(out), "--engine", "fake", "--set", "seconds=0.5", "-q", stdin="from stdin")
    assert result.returncode == 0, result.stderr
    assert _samples(out)[1].tobytes() == render_bytes("from stdin", 24000, seconds=0.5)


def test_say_speaks_with_espeak(tmp_path: Path) -> None:
    out = tmp_path / "espeak.wav"
    result = _cli("say", "Hello from the command line.", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stderr and "22050 Hz" in result.stderr
    rate, samples = _samples(out)
    assert rate == 22050 and len(samples) > 22050 // 2
    assert np.sqrt(np.mean(samples.astype(np.float64) ** 2)) > 300


def test_say_reports_a_sidecar_that_cannot_start(tmp_path: Path) -> None:
    result = _cli("say", "x", "-o", str(tmp_path / "no.wav"), "--engine", "nope")
    assert result.returncode == 1
    assert "unknown engine 'nope'" in result.stderr and "exited with code 2" in result.stderr
    assert not (tmp_path / "no.wav").exists()


def test_say_reports_a_rejected_request_option(tmp_path: Path) -> None:
    result = _cli("say", "x", "-o", str(tmp_path / "no.wav"), "--engine", "fake", "--set", "sede=1")
    assert result.returncode == 1
    assert "unknown_option" in result.stderr and "sede" in result.stderr


def test_say_rejects_a_malformed_emotion(tmp_path: Path) -> None:
    result = _cli("say", "x", "-o", str(tmp_path / "no.wav"), "--emotion", "joyful=2")
    assert result.returncode != 0
    assert "--emotion takes NAME=WEIGHT pairs" in result.stderr


def test_say_prints_an_error_with_brackets_verbatim(tmp_path: Path) -> None:
    result = _cli(
        "say",
        "x",
        "-o",
        str(tmp_path / "no.wav"),
        "--engine",
        "fake",
        "--set",
        "fail_at=0",
        "--set",
        'fail_message="[bold]x[/]"',
    )
    assert result.returncode == 1
    assert "[bold]x[/]" in result.stderr
