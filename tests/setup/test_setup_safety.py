"""What setup and ``envs remove`` may delete, hostile homes and records, and the checks made before any work.

Canary folders lie beside and above ``INDEXTTS_HOME``; every refusal is one line and leaves
them (and what they hold) as they were.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from conftest import run_cli
from harness import make_checkpoints
from hub_support import Hub, standin_repos

from indextts_client._registry import MARKER, EnvRecord, read_record, write_marker, write_record

ADOPT = ["--python", sys.executable, "--no-verify"]


def _canary(folder: Path) -> Path:
    """A folder with content that must survive: a 'documents' folder given by mistake."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("keep me")
    return folder


def _intact(folder: Path) -> bool:
    return (folder / "notes.txt").read_text() == "keep me"


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _dead_port() -> int:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def canaries(tmp_path: Path, home: Path) -> list[Path]:
    home.mkdir(parents=True)
    return [_canary(tmp_path / "beside"), _canary(home.parent.parent / f"above-{tmp_path.name}")]


def _marked_venv(folder: Path, home: Path, engine: str = "indextts2") -> Path:
    """A folder as setup leaves it: pyvenv.cfg, and the marker beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyvenv.cfg").write_text("home = /usr/bin\n")
    write_marker(folder, engine, home)
    return folder


# ----------------------------------------------------------------------------------------- --force


def test_force_never_deletes_a_folder_setup_did_not_build(tmp_path: Path, canaries: list[Path]) -> None:
    for canary in canaries:  # beside the home, and above it
        # The reproduction: --force on a documents folder, with a run that would fail later anyway.
        for extra in ([], ["--base-python", "/nonexistent"]):
            result = run_cli(["setup", "indextts2", "--venv", str(canary), "--force", "--torch", "cpu", *extra])
            assert result.returncode == 1
            line = _one_line(result)
            assert line.startswith(
                f"indextts-client setup: refusing to delete {canary}: {canary} carries no setup marker"
            )
            assert _intact(canary)
        # Without --force, a folder that is not empty and no venv is refused as well (nothing is built into it).
        result = run_cli(["setup", "indextts2", "--venv", str(canary), "--torch", "cpu"])
        assert result.returncode == 1 and "not empty and not a working venv" in _one_line(result)
        assert _intact(canary) and sorted(p.name for p in canary.iterdir()) == ["notes.txt"]


def test_force_refuses_a_working_venv_without_the_marker(tmp_path: Path) -> None:
    venv = tmp_path / "theirs"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    result = run_cli(["setup", "indextts2", "--venv", str(venv), "--force", "--torch", "cpu"])
    assert result.returncode == 1
    assert "--force replaces only a venv setup built" in _one_line(result)
    assert (venv / "pyvenv.cfg").is_file() and (venv / "bin" / "python").exists()


def test_a_marker_copied_into_another_folder_does_not_make_it_deletable(tmp_path: Path, home: Path) -> None:
    built = _marked_venv(home / "venvs" / "indextts2", home)
    copy = _canary(tmp_path / "copy")
    (copy / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (copy / MARKER).write_bytes((built / MARKER).read_bytes())
    result = run_cli(["setup", "indextts2", "--venv", str(copy), "--force", "--torch", "cpu"])
    assert result.returncode == 1 and "names another folder" in _one_line(result)
    assert _intact(copy)


# ---------------------------------------------------------------------------------------- envs remove


@pytest.mark.parametrize("name", ["../../victim", "../victim", "/abs/victim", "victim", "indextts2/../indextts2"])
def test_envs_remove_takes_an_engine_name_never_a_path(tmp_path: Path, home: Path, name: str) -> None:
    victim = _canary(tmp_path / "victim")
    (tmp_path / "victim.json").write_text(msgspec.json.encode({"engine": "x", "venv": str(victim)}).decode())
    if name.startswith("/"):
        name = str(tmp_path / "victim")
    result = run_cli(["envs", "remove", name])
    assert result.returncode == 2
    assert _one_line(result) == f"indextts-client envs: ENGINE is one of indextts2, indextts2.5, not {name!r}"
    assert _intact(victim) and (tmp_path / "victim.json").is_file()


def test_envs_remove_of_an_edited_record_deletes_no_folder_setup_did_not_build(
    tmp_path: Path, home: Path, canaries: list[Path]
) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt")
    for canary in canaries:
        (canary / "pyvenv.cfg").write_text("home = /usr/bin\n")  # looks like a venv, but setup did not build it
        write_record(
            EnvRecord(
                engine="indextts2",
                python=str(canary / "bin" / "python"),
                model_dir=str(ckpt),
                status="ready",
                venv=str(canary),
            )
        )
        result = run_cli(["envs", "remove", "indextts2"])
        assert result.returncode == 1
        line = _one_line(result)
        assert line == (
            f"indextts-client envs: removed the record of indextts2 but kept {canary}: {canary} carries no setup "
            f"marker ({MARKER}): setup did not build it"
        )
        assert _intact(canary) and read_record("indextts2") is None


def test_a_record_whose_paths_do_not_hold_is_no_environment_and_deletes_nothing(
    tmp_path: Path, home: Path, canaries: list[Path]
) -> None:
    beside = canaries[0]
    edits = [
        {"python": "relative/bin/python", "venv": str(beside)},  # not absolute
        {"python": sys.executable, "venv": str(beside)},  # the interpreter is not inside the venv
        {"python": str(beside / "bin/python"), "venv": "../beside"},
        {"engine": "indextts2.5", "python": str(beside / "bin/python"), "venv": str(beside)},  # another engine's
    ]
    for edit in edits:
        record = {"engine": "indextts2", "model_dir": str(tmp_path), "status": "ready", **edit}
        (home / "envs").mkdir(parents=True, exist_ok=True)
        (home / "envs" / "indextts2.json").write_bytes(msgspec.json.encode(record))
        assert read_record("indextts2") is None, edit  # discovery does not use it
        result = run_cli(["envs", "remove", "indextts2"])
        assert result.returncode == 1, result.stderr
        line = _one_line(result)
        assert line.startswith("indextts-client envs: removed the record of indextts2, which was not valid (")
        assert line.endswith("no folder was deleted")
        assert _intact(beside) and not (home / "envs" / "indextts2.json").exists()


def test_envs_remove_deletes_the_venv_setup_built_inside_the_home_and_where_its_marker_says(
    tmp_path: Path, home: Path
) -> None:
    for venv in (home / "venvs" / "indextts2", tmp_path / "elsewhere" / "venv"):
        _marked_venv(venv, home)
        python = str(venv / "bin" / "python")
        write_record(EnvRecord(engine="indextts2", python=python, model_dir=str(tmp_path), venv=str(venv)))
        result = run_cli(["envs", "remove", "indextts2"])
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"removed indextts2 and its venv {venv}")
        assert not venv.exists()


# ------------------------------------------------------------------------------------- hostile homes


def _hostile_homes(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    return {
        "a file": (a_file, f"{a_file} is a file, not a directory"),
        "a symlink loop": (loop, f"{loop} is a symlink loop"),
        "a path under a file": (a_file / "home", f"it lies under the file {a_file}"),
    }


@pytest.mark.parametrize("kind", ["a file", "a symlink loop", "a path under a file"])
def test_an_unusable_home_is_one_line_for_setup_and_envs_remove(tmp_path: Path, kind: str) -> None:
    home, why = _hostile_homes(tmp_path)[kind]
    env = {"INDEXTTS_HOME": str(home)}
    setup = run_cli(["setup", "indextts2", *ADOPT, "--model-dir", str(tmp_path)], env)
    assert setup.returncode == 1
    assert _one_line(setup) == (
        f"indextts-client setup: INDEXTTS_HOME {home} cannot hold the environments: {why}; "
        "point INDEXTTS_HOME at a directory"
    )
    removed = run_cli(["envs", "remove", "indextts2"], env)
    assert removed.returncode == 1
    assert _one_line(removed) == f"indextts-client envs: INDEXTTS_HOME {home} cannot be used: {why}"
    assert (tmp_path / "a-file").read_text() == "not a folder"


# --------------------------------------------------------------------------- cheap checks, before any work


def test_a_bad_model_dir_is_refused_before_the_venv_is_built(tmp_path: Path, home: Path) -> None:
    venv = tmp_path / "venv"
    ckpt25 = make_checkpoints(tmp_path / "ckpt25", version="2.5")
    for model_dir, expected in (
        (tmp_path / "nowhere", "no such directory"),
        (ckpt25, "holds IndexTTS-2.5 checkpoints, not IndexTTS-2"),
        (make_checkpoints(tmp_path / "partial", skip=("gpt.pth",)), "lacks gpt.pth"),
    ):
        result = run_cli(["setup", "indextts2", "--venv", str(venv), "--torch", "cpu", "--model-dir", str(model_dir)])
        assert result.returncode == 1 and expected in _one_line(result)
        assert not venv.exists() and not (home / "logs").exists()


def test_an_unknown_hub_id_is_refused_before_the_venv_is_built(tmp_path: Path, home: Path) -> None:
    venv = tmp_path / "venv"
    with Hub(standin_repos()).running() as hub:
        result = run_cli(
            ["setup", "indextts2", "--venv", str(venv), "--torch", "cpu", "--model", "IndexTeam/IndexTTS-9"],
            {"HF_ENDPOINT": hub.url},
        )
    assert result.returncode == 1 and "no model IndexTeam/IndexTTS-9 on" in _one_line(result)
    assert not venv.exists()
    record = read_record("indextts2")
    assert record is not None and not record.ready and record.error is not None  # incomplete from the start


def test_too_little_disk_for_the_venv_is_refused_before_it_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The free space is simulated (setup asks shutil.disk_usage): 1 GB free, a CPU venv needs 3.
    import shutil

    from indextts_client._cli import main
    from indextts_client._setup import _preflight

    real = shutil.disk_usage
    monkeypatch.setattr(_preflight.shutil, "disk_usage", lambda path: real(path)._replace(free=10**9))
    venv = tmp_path / "venv"
    ckpt = make_checkpoints(tmp_path / "ckpt")
    args = ["setup", "indextts2", "-q", "--venv", str(venv), "--torch", "cpu", "--model-dir", str(ckpt)]
    assert main(args) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        f"indextts-client setup: the disk under {venv} has 1.0 GB free and the venv needs about 3 GB (torch cpu): "
        "free space there, or build it elsewhere (--venv DIR)"
    )
    assert not venv.exists()


def test_adopting_a_system_python_is_refused(tmp_path: Path) -> None:
    base = sys._base_executable  # type: ignore[attr-defined]  # this venv's base interpreter: no venv
    result = run_cli(["setup", "indextts2", "--python", base, "--no-verify", "--model-dir", str(tmp_path)])
    assert result.returncode == 1
    line = _one_line(result)
    assert line.startswith(f"indextts-client setup: --python {base} is ")
    assert "setup installs into the venv it adopts: make one" in line
    managed = Path("/usr/bin/python3")
    if managed.exists() and list(Path("/usr/lib").glob("python3*/EXTERNALLY-MANAGED")):
        result = run_cli(["setup", "indextts2", "--python", str(managed), "--no-verify"])
        assert result.returncode == 1 and "an externally managed system Python" in _one_line(result)


def test_adopting_a_venv_without_pip_when_pip_installs_is_refused_first(tmp_path: Path) -> None:
    venv = tmp_path / "nopip"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    ckpt = make_checkpoints(tmp_path / "ckpt")
    result = run_cli(["setup", "indextts2", "--python", str(python), "--installer", "pip", "--model-dir", str(ckpt)])
    assert result.returncode == 1
    assert "that venv has no pip and no uv was found" in _one_line(result)


# --------------------------------------------------------------------------- a ready record stays ready


def test_a_failed_rerun_leaves_a_ready_environment_ready_and_says_what_it_wanted(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt")
    assert run_cli(["setup", "indextts2", *ADOPT, "--model-dir", str(ckpt)]).returncode == 0
    ready = read_record("indextts2")
    assert ready is not None and ready.ready
    # The mistaken re-run: no --model-dir, and the hub cannot be reached.
    endpoint = f"http://127.0.0.1:{_dead_port()}"
    result = run_cli(["setup", "indextts2", *ADOPT], {"HF_ENDPOINT": endpoint, "HF_HUB_ETAG_TIMEOUT": "5"})
    assert result.returncode == 1
    line = _one_line(result)
    assert line.startswith(f"indextts-client setup: cannot reach the hub at {endpoint} for IndexTeam/IndexTTS-2")
    assert f"; indextts2 stays ready as it was ({sys.executable} with {ckpt})" in line
    assert line.endswith(
        f": this run wanted to adopt {sys.executable} and the checkpoints of IndexTeam/IndexTTS-2 from the hub "
        "(no --model-dir)"
    )
    after = read_record("indextts2")
    assert after == ready  # the very record, not rewritten
    # say finds it as before (the record discovery reads).
    assert run_cli(["envs", "--json"]).stdout.count('"status":"ready"') == 1
