"""Audio.to_file / to_bytes: WAV with the standard library, FLAC and Ogg through soundfile."""

from __future__ import annotations

import io
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from indextts_client import Audio

soundfile = pytest.importorskip("soundfile")


def audio() -> Audio:
    rng = np.random.default_rng(1)
    return Audio((rng.standard_normal(12345) * 4000).astype("<i2"), 22050)


def test_wav_bytes_hold_exactly_the_samples() -> None:
    a = audio()
    with wave.open(io.BytesIO(a.to_bytes("wav")), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 22050)
        assert wav.readframes(wav.getnframes()) == a.samples.tobytes()


def test_flac_is_lossless(tmp_path: Path) -> None:
    a = audio()
    a.to_file(tmp_path / "x.flac")
    data, rate = soundfile.read(tmp_path / "x.flac", dtype="int16")
    assert rate == 22050 and np.array_equal(data, a.samples)
    assert (tmp_path / "x.flac").read_bytes()[:4] == b"fLaC"
    assert a.to_bytes("FLAC")[:4] == b"fLaC"


def test_ogg_is_vorbis_of_the_same_length(tmp_path: Path) -> None:
    a = audio()
    a.to_file(tmp_path / "x.ogg")
    info = soundfile.info(tmp_path / "x.ogg")
    assert (info.format, info.subtype, info.samplerate, info.channels) == ("OGG", "VORBIS", 22050, 1)
    assert info.frames == len(a)
    assert (tmp_path / "x.ogg").read_bytes()[:4] == b"OggS"


def test_the_suffix_chooses_the_format_and_an_unknown_one_is_refused_before_writing(tmp_path: Path) -> None:
    a = audio()
    a.to_file(tmp_path / "x.WAV")
    assert (tmp_path / "x.WAV").read_bytes()[:4] == b"RIFF"
    with pytest.raises(ValueError, match=r"use \.wav, \.flac or \.ogg"):
        a.to_file(tmp_path / "x.mp3")
    assert not (tmp_path / "x.mp3").exists()
    with pytest.raises(ValueError, match="unknown audio format 'mp3'"):
        a.to_bytes("mp3")
    buffer = io.BytesIO()
    a.to_file(buffer, format="flac")
    assert buffer.getvalue()[:4] == b"fLaC"
    with pytest.raises(ValueError, match="give format="):
        a.to_file(io.BytesIO())


def test_to_wav_into_a_missing_directory_raises_once_and_leaves_no_writer_behind(tmp_path: Path) -> None:
    # Warnings are errors here: an "Exception ignored in Wave_write.__del__" would fail the test.
    with pytest.raises(FileNotFoundError):
        audio().to_wav(tmp_path / "missing" / "x.wav")


def test_without_soundfile_flac_says_what_to_install_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "soundfile", None)  # as in a venv without the audio extra
    a = audio()
    with pytest.raises(RuntimeError, match=r"pip install soundfile \(the \[audio\] extra\)"):
        a.to_file(tmp_path / "x.flac")
    assert not (tmp_path / "x.flac").exists()
    assert a.to_bytes("wav")[:4] == b"RIFF"  # WAV needs nothing
