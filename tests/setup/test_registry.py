"""The registry and discovery: what setup registers is what Client, say and doctor use when told nothing."""

from __future__ import annotations

import json
import sys
import wave
from pathlib import Path

import msgspec
import pytest
from conftest import run_cli
from harness import make_checkpoints

from indextts_client import Client, StartError
from indextts_client._pool._cli import add_pool_arguments, pool_kwargs
from indextts_client._registry import EnvRecord, discover, read_record, write_marker, write_record

pytestmark = pytest.mark.anyio


def _register(model_dir: Path, *, status: str = "ready", engine: str = "indextts2") -> EnvRecord:
    record = EnvRecord(engine=engine, python=sys.executable, model_dir=str(model_dir), status=status, source="adopted")
    write_record(record)
    return record


async def test_an_indextts_engine_without_an_environment_is_a_start_error_naming_the_setup_command() -> None:
    client = Client("indextts2")
    with pytest.raises(StartError) as caught:
        await client.start()
    assert "run `indextts-client setup indextts2`" in str(caught.value)
    await client.aclose()


async def test_an_incomplete_record_is_no_environment(tmp_path: Path) -> None:
    _register(make_checkpoints(tmp_path / "ckpt"), status="incomplete")
    with pytest.raises(StartError, match=r"run `indextts-client setup indextts2`"):
        async with Client("indextts2"):
            pass
    # The auto engine looks for either version.
    with pytest.raises(StartError, match=r"run `indextts-client setup indextts2`"):
        async with Client("indextts"):
            pass


async def test_the_registered_environment_runs_the_engine(
    tmp_path: Path, standin_env: dict[str, str], voice: str
) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt")
    _register(ckpt)
    async with Client("indextts2", env=standin_env) as client:
        assert client.argv[:3] == [sys.executable, "-m", "indextts_sidecar"]
        assert ["-o", f"model_dir={json.dumps(str(ckpt))}"] == client.argv[5:7]
        audio = await client.synthesize("Hello there.", voice=voice)
        loaded = await client.load()
    assert len(audio) > 0 and audio.sample_rate == 22050
    assert loaded["model_dir"] == str(ckpt)


def test_explicit_arguments_win_and_other_engines_are_untouched(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt")
    _register(ckpt)
    mine = str(tmp_path / "mine")
    assert discover("indextts2", python="/x/python", command=None, engine_options=None).python == "/x/python"
    given = discover("indextts2", python=None, command=None, engine_options={"model_dir": mine})
    assert given.python is None and given.engine_options == {"model_dir": mine} and given.env == {}
    assert discover("fake", python=None, command=None, engine_options=None) == (None, None, {}, None)
    assert discover("espeak", python=None, command=None, engine_options=None).missing is None
    found = discover("indextts", python=None, command=None, engine_options={"fp16": True})
    assert found.python == sys.executable
    assert found.engine_options == {"model_dir": str(ckpt), "fp16": True}
    assert found.env == {"HF_HUB_OFFLINE": "1"}


def test_serve_and_wyoming_pass_no_python_unless_given_so_the_client_discovers() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_pool_arguments(parser)
    assert "python" not in pool_kwargs(parser.parse_args(["--engine", "indextts2"]), parser)
    assert pool_kwargs(parser.parse_args(["--python", "/p"]), parser)["python"] == "/p"


def test_say_speaks_through_the_registered_environment(tmp_path: Path, standin_env: dict[str, str], voice: str) -> None:
    _register(make_checkpoints(tmp_path / "ckpt"))
    out = tmp_path / "hello.wav"
    result = run_cli(
        ["say", "Hello there.", "--engine", "indextts2", "--voice", voice, "-o", str(out), "-q"], standin_env
    )
    assert result.returncode == 0, result.stderr
    with wave.open(str(out)) as w:
        assert w.getframerate() == 22050 and w.getnframes() > 0


def test_say_without_an_environment_names_the_setup_command(tmp_path: Path, voice: str) -> None:
    result = run_cli(["say", "Hi.", "--engine", "indextts2", "--voice", voice, "-o", str(tmp_path / "x.wav"), "-q"])
    assert result.returncode == 1
    assert "`indextts-client setup indextts2`" in result.stderr and "Traceback" not in result.stderr


def test_doctor_checks_the_registered_environment(tmp_path: Path, standin_env: dict[str, str]) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt")
    _register(ckpt)
    result = run_cli(["doctor", "--engine", "indextts2"], {**standin_env, "COLUMNS": "300"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert str(ckpt) in result.stdout and "IndexTTS-2" in result.stdout


def test_doctor_without_python_or_environment_names_the_setup_command() -> None:
    result = run_cli(["doctor", "--engine", "indextts2.5"])
    assert result.returncode == 2
    assert result.stderr.strip().endswith("run `indextts-client setup indextts2.5`")


def test_envs_lists_and_removes(tmp_path: Path, home: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt")
    _register(ckpt)
    venv = tmp_path / "built-venv"  # what setup builds: pyvenv.cfg, and its marker beside it
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    write_marker(venv, "indextts2.5", home)
    python = str(venv / "bin" / "python")
    write_record(EnvRecord(engine="indextts2.5", python=python, model_dir="/m", venv=str(venv)))
    listed = msgspec.json.decode(run_cli(["envs", "--json"]).stdout, type=list[EnvRecord])
    assert [(r.engine, r.status, r.python) for r in listed] == [
        ("indextts2", "ready", sys.executable),
        ("indextts2.5", "incomplete", python),
    ]
    table = run_cli(["envs"]).stdout
    assert "indextts2 " in table and "ready" in table and str(ckpt) in table
    removed = run_cli(["envs", "remove", "indextts2.5"])
    assert removed.returncode == 0 and "removed indextts2.5" in removed.stdout
    assert read_record("indextts2.5") is None and not venv.exists() and read_record("indextts2") is not None
    again = run_cli(["envs", "remove", "indextts2.5"])
    assert again.returncode == 1 and "no environment registered for indextts2.5" in again.stderr
    assert (home / "envs" / "indextts2.json").is_file()


async def test_a_pool_uses_the_registered_environment(tmp_path: Path, standin_env: dict[str, str], voice: str) -> None:
    from indextts_client import Pool

    _register(make_checkpoints(tmp_path / "ckpt"))
    async with Pool("indextts2", size=1, env=standin_env) as pool:
        audio = await pool.synthesize("Hello there.", voice=voice)
    assert len(audio) > 0 and audio.sample_rate == 22050


def test_a_blocking_client_uses_the_registered_environment(
    tmp_path: Path, standin_env: dict[str, str], voice: str
) -> None:
    from indextts_client import BlockingClient

    _register(make_checkpoints(tmp_path / "ckpt"))
    with BlockingClient("indextts2", env=standin_env) as client:
        audio = client.synthesize("Hello.", voice=voice)
    assert len(audio) > 0 and audio.sample_rate == 22050
