"""`indextts-client say`: a real sidecar behind the command line."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
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


def _one_line_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_an_unwritable_output_is_refused_before_any_work(tmp_path: Path) -> None:
    # --engine nope would fail to start: the path check must come first, so that is not the error.
    result = _cli("say", "x", "-o", str(tmp_path / "missing" / "x.wav"), "--engine", "nope")
    _one_line_error(result, 2, "indextts-client: cannot write", "does not exist")
    result = _cli("say", "x", "-o", str(tmp_path / "x.mp3"), "--engine", "nope")
    _one_line_error(result, 2, "use .wav, .flac or .ogg")
    assert list(tmp_path.iterdir()) == []


def test_say_writes_flac_by_suffix(tmp_path: Path) -> None:
    soundfile = pytest.importorskip("soundfile")
    out = tmp_path / "fake.flac"
    result = _cli("say", "hello there", "-o", str(out), "--engine", "fake", "-q")
    assert result.returncode == 0, result.stderr
    data, rate = soundfile.read(out, dtype="int16")
    assert rate == 24000 and data.tobytes() == render_bytes("hello there", 24000)


def test_dash_output_writes_wav_to_standard_output(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "indextts_client", "say", "hello there", "-o", "-", "--engine", "fake", "-q"],
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "-").exists()
    with wave.open(io.BytesIO(result.stdout), "rb") as wav:
        assert wav.getframerate() == 24000
        assert wav.readframes(wav.getnframes()) == render_bytes("hello there", 24000)


def test_a_malformed_set_is_called_a_request_option(tmp_path: Path) -> None:
    result = _cli("say", "x", "-o", str(tmp_path / "x.wav"), "--engine", "fake", "--set", "rate")
    _one_line_error(result, 2, "--set: request option 'rate' is not KEY=VALUE")
    result = _cli("say", "x", "-o", str(tmp_path / "x.wav"), "--engine", "fake", "--option", "rate")
    _one_line_error(result, 2, "--option: engine option 'rate' is not KEY=VALUE")


def test_emotion_alpha_must_be_in_the_unit_interval(tmp_path: Path) -> None:
    result = _cli("say", "x", "-o", str(tmp_path / "x.wav"), "--emotion", "happy=0.5", "--emotion-alpha", "9")
    assert result.returncode == 2 and "--emotion-alpha: 9 is outside 0..1" in result.stderr


def test_timeouts_must_be_positive_seconds_and_are_refused_by_the_parser(tmp_path: Path) -> None:
    # Before: `say --timeout -1` was a ValueError traceback from inside the client.
    for flag in ("--timeout", "--ready-timeout"):
        for value in ("-1", "0", "nan", "inf", "soon"):
            result = _cli("say", "x", "-o", str(tmp_path / "x.wav"), "--engine", "fake", f"{flag}={value}")
            assert result.returncode == 2 and "Traceback" not in result.stderr, (flag, value, result.stderr)
            assert f"argument {flag}: " in result.stderr.splitlines()[-1], result.stderr


def test_verbose_works_after_the_subcommand(tmp_path: Path) -> None:
    for args in (["-v", "say", "hi"], ["say", "-v", "hi"], ["say", "hi", "-v"]):
        out = tmp_path / "v.wav"
        result = _cli(*args, "-o", str(out), "--engine", "fake")
        assert result.returncode == 0, result.stderr
        # -v shows the client's INFO log lines.
        assert "indextts_client: sidecar ready: engine fake" in result.stderr, result.stderr
    quiet = _cli("say", "hi", "-o", str(tmp_path / "q.wav"), "--engine", "fake")
    assert quiet.returncode == 0 and "sidecar ready" not in quiet.stderr


def _without_rich(*argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI with `import rich` failing, as in a venv without the cli extra (a None in sys.modules)."""
    code = (
        f"import sys; sys.modules['rich'] = None\nfrom indextts_client._cli import main\nsys.exit(main({list(argv)!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, check=False
    )


def test_say_runs_without_rich_and_writes_the_same_audio(tmp_path: Path) -> None:
    for quiet in ([], ["-q"]):
        out = tmp_path / f"plain{len(quiet)}.wav"
        result = _without_rich("say", "plain text", "-o", str(out), "--engine", "fake", *quiet)
        assert result.returncode == 0, result.stderr
        rate, samples = _samples(out)
        assert samples.tobytes() == render_bytes("plain text", rate)
        assert ("wrote " in result.stderr) == (not quiet), result.stderr
    failed = _without_rich("say", "x", "-o", str(tmp_path / "f.wav"), "--engine", "fake", "--set", "fail_at=0")
    _one_line_error(failed, 1, "error:")


def test_engines_and_doctor_run_without_rich() -> None:
    listed = _without_rich("engines", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {"fake", "espeak"} <= {e["name"] for e in json.loads(listed.stdout)}
    table = _without_rich("engines")
    assert table.returncode == 0, table.stderr
    assert any(line.split()[:2] == ["fake", "yes"] for line in table.stdout.splitlines()), table.stdout
    doctor = _without_rich("doctor", "--python", sys.executable, "--engine", "fake")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "engine fake" in doctor.stdout and doctor.stdout.strip().endswith("ready to synthesize"), doctor.stdout


def test_emotion_weights_have_the_range_of_emotion_alpha(tmp_path: Path) -> None:
    for weight in ("2", "-0.5"):
        result = _cli("say", "x", "-o", str(tmp_path / "x.wav"), "--engine", "fake", "--emotion", f"happy={weight}")
        _one_line_error(result, 2, f"--emotion weight happy={weight} is outside 0..1")
    assert not (tmp_path / "x.wav").exists()
    ok = _cli("say", "x", "-o", str(tmp_path / "x.wav"), "--engine", "fake", "--emotion", "happy=1", "-q")
    assert ok.returncode == 0, ok.stderr


def test_say_can_pass_the_max_text_that_its_error_names(tmp_path: Path) -> None:
    text = "a" * 30
    refused = _cli("say", text, "-o", str(tmp_path / "x.wav"), "--engine", "fake", "--max-text", "20", "-q")
    _one_line_error(refused, 1, "longer than the limit of 20 (--max-text)")
    out = tmp_path / "y.wav"
    allowed = _cli("say", text, "-o", str(out), "--engine", "fake", "--max-text", "30", "-q")
    assert allowed.returncode == 0, allowed.stderr
    rate, samples = _samples(out)
    assert samples.tobytes() == render_bytes(text, rate)
    assert _cli("say", "x", "-o", str(out), "--max-text", "0").returncode == 2


def test_engines_lists_each_engine_with_its_rate_and_availability() -> None:
    result = _cli("engines", "--json")
    assert result.returncode == 0, result.stderr
    engines = {e["name"]: e for e in json.loads(result.stdout)}
    assert {"fake", "espeak", "indextts", "indextts2", "indextts2.5"} <= set(engines)
    espeak = engines["espeak"]
    assert (espeak["available"], espeak["native_sample_rate"], espeak["problem"]) == (True, 22050, None)
    assert "voices" in espeak["capabilities"] and espeak["description"].startswith("espeak-ng speech")
    assert engines["fake"]["available"] and "fault_injection" in engines["fake"]["capabilities"]
    # No IndexTTS in the test venv: reported, not raised.
    assert engines["indextts2"]["available"] is False and "IndexTTS-2" in engines["indextts2"]["problem"]
    table = _cli("engines")
    assert table.returncode == 0 and "espeak" in table.stdout and "indextts2.5" in table.stdout


def test_engines_with_a_missing_interpreter_is_one_line(tmp_path: Path) -> None:
    _one_line_error(_cli("engines", "--python", str(tmp_path / "nope")), 2, "cannot run")


def test_flac_without_soundfile_is_one_line_before_any_work(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['soundfile'] = None\n"
        "from indextts_client._cli import main\n"
        f"sys.exit(main(['say', 'x', '-o', {str(tmp_path / 'x.flac')!r}, '--engine', 'nope']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    _one_line_error(result, 2, "FLAC and Ogg need soundfile", "pip install soundfile")
    assert not (tmp_path / "x.flac").exists()


def test_say_ssml_speaks_breaks_and_refuses_what_the_engine_cannot(tmp_path: Path) -> None:
    out = tmp_path / "ssml.wav"
    ssml = '<speak>hi<break time="125ms"/><sub alias="there">x</sub></speak>'
    result = _cli("say", ssml, "-o", str(out), "--engine", "fake", "--ssml", "-q")
    assert result.returncode == 0, result.stderr
    expected = render_bytes("hi", 24000) + bytes(2 * 3000) + render_bytes("there", 24000)
    assert _samples(out)[1].tobytes() == expected
    refused = _cli(
        "say", '<speak><phoneme alphabet="pinyin" ph="a1">a</phoneme></speak>', "-o", str(out), "--ssml", "-q"
    )
    assert refused.returncode != 0
    assert "unsupported" in refused.stderr and "line 1, column 8" in refused.stderr
