"""The scripts in examples/ run and print what they promise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import wave
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
TIMEOUT = 30


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written into the repository
    return env


def run_example(name: str, *args: str, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, f"{name} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_say(tmp_path: Path) -> None:
    pytest.importorskip("espeakng_loader")
    out = run_example("say.py", "out.wav", cwd=tmp_path)
    assert "wrote out.wav" in out
    with wave.open(str(tmp_path / "out.wav"), "rb") as wav:
        assert wav.getnchannels() == 1
        assert wav.getsampwidth() == 2
        assert wav.getframerate() == 22050
        assert wav.getnframes() > 0


def test_say_default_path(tmp_path: Path) -> None:
    pytest.importorskip("espeakng_loader")
    run_example("say.py", cwd=tmp_path)
    with wave.open(str(tmp_path / "hello.wav"), "rb") as wav:
        assert wav.getnframes() > 0


@pytest.mark.parametrize("engine", ["fake", "espeak"])
def test_stream_with_progress(tmp_path: Path, engine: str) -> None:
    if engine == "espeak":
        pytest.importorskip("espeakng_loader")
    out = run_example("stream_with_progress.py", engine, cwd=tmp_path)
    assert f"engine {engine}" in out
    assert "progress load" in out
    chunks = [(int(m[1]), int(m[2])) for m in re.finditer(r"^chunk \d+: offset (\d+) samples, length (\d+)", out, re.M)]
    assert len(chunks) >= 2
    position = 0
    for offset, length in chunks:
        assert offset == position
        position += length
    assert f"done: {position} samples" in out


def test_concurrent_and_cancel(tmp_path: Path) -> None:
    out = run_example("concurrent_and_cancel.py", cwd=tmp_path)
    assert "long: cancelled by its scope: True" in out
    assert "timed out: timeout after 0.5 s" in out
    assert sum(line.startswith("short ") for line in out.splitlines()) == 3
    assert "after: loaded=True queue_depth=0" in out
    assert "same sidecar: True, restarts: 0" in out


def test_trio_example(tmp_path: Path) -> None:
    pytest.importorskip("trio")
    out = run_example("trio_example.py", cwd=tmp_path)
    assert "model loaded" in out
    assert "first chunk:" in out
    assert "given up: True" in out
    assert "ping after a cancel: loaded=True" in out


@pytest.mark.parametrize("plugins", [[], ["-p", "no:timeout"]], ids=["as-is", "without-pytest-timeout"])
def test_pytest_example(tmp_path: Path, plugins: list[str]) -> None:
    # Its header's command, also where only pytest and anyio are installed (this project's ini
    # names pytest-timeout's `timeout`, an unknown option, an error with warnings as errors, there).
    path = EXAMPLES / "test_with_fake_engine.py"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugins, str(path)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert re.search(r"\b5 passed\b", result.stdout), result.stdout


@pytest.mark.parametrize("engine", ["fake", "espeak"])
def test_pool(tmp_path: Path, engine: str) -> None:
    if engine == "espeak":
        pytest.importorskip("espeakng_loader")
    out = run_example("pool.py", engine, "2", cwd=tmp_path)
    assert len(re.findall(r"^line \d: \d+\.\d\d s of audio$", out, re.M)) == 4
    served = [int(n) for n in re.findall(r"served (\d+)", out)]
    assert len(served) == 2 and sum(served) == 4


def test_serve_http(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    out = run_example("serve_http.py", "fake", cwd=tmp_path)
    assert re.search(r"^got \d+ bytes of audio/mpeg$", out, re.M)


def test_serve_http_ends_before_its_ready_wait_when_the_engine_cannot_load(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    env = _env()  # espeak as in a venv without the [espeak] extra (tests/without_extras)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "without_extras"), env["PYTHONPATH"]])
    env["INDEXTTS_TEST_WITHOUT"] = "espeakng_loader"
    # At once, not after its 60 s wait for ready: 1.2-1.7 s here on two idle cores; 30 s is over 10 times that.
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "serve_http.py"), "espeak"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert result.stderr.startswith("serve_http: the engine could not start: "), result.stderr
    assert "install the [espeak] extra" in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize("name", ["out.wav", "out.flac"])
def test_blocking(tmp_path: Path, name: str) -> None:
    pytest.importorskip("espeakng_loader")
    soundfile = pytest.importorskip("soundfile")
    out = run_example("blocking.py", name, cwd=tmp_path)
    assert "voices for en-us: English (America)" in out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("chunk")] == [
        "chunk 0",
        "chunk 1",
        "chunk 2",
    ]
    samples = int(re.search(rf"wrote {re.escape(name)}: (\d+) samples at 22050 Hz", out).group(1))  # type: ignore[union-attr]
    data, rate = soundfile.read(tmp_path / name, dtype="int16")
    assert rate == 22050 and len(data) == samples > 0


def test_remote_sidecar(tmp_path: Path) -> None:
    out = run_example("remote_sidecar.py", cwd=tmp_path)
    assert "sidecar listening on unix://" in out
    assert "wrong token: AuthenticationError" in out
    assert "registered: registered:alice" in out
    assert re.search(r"^alice: \d+\.\d\d s of audio$", out, re.M) and re.search(r"^bob: ", out, re.M)
    assert "same sidecar: True" in out
    assert "sidecar exit code: 0" in out
