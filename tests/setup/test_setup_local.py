"""setup without the hub: adopting a venv, checkpoints on disk, verification, bad input found before any download."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from conftest import run_cli
from harness import make_checkpoints

from indextts_client._registry import read_record
from indextts_sidecar import __version__


def test_adopting_a_venv_verifies_and_registers_it(tmp_path: Path, standin_env: dict[str, str]) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt")
    result = run_cli(["setup", "indextts2", "--python", sys.executable, "--model-dir", str(ckpt)], standin_env)
    assert result.returncode == 0, result.stderr
    # The verification spoke: the doctor passed, then one synthesis on the device it found.
    assert "samples at 22050 Hz on cpu" in result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(f"indextts2 is ready: {sys.executable} with {ckpt}")
    assert "indextts-client serve --engine indextts2" in last
    record = read_record("indextts2")
    assert record is not None and record.ready and record.verified
    assert (record.python, record.model_dir, record.source, record.device) == (
        sys.executable,
        str(ckpt),
        "adopted",
        "cpu",
    )
    assert record.versions["indextts-sidecar"] == __version__ and record.versions["transformers"] == "4.52.1"


def test_quiet_prints_only_the_last_line(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt")
    result = run_cli(["setup", "indextts2", "-q", "--no-verify", "--python", sys.executable, "--model-dir", str(ckpt)])
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("indextts2 is ready:") and len(result.stdout.splitlines()) == 1


def test_a_failed_verification_leaves_nothing_ready_and_a_rerun_repairs(
    tmp_path: Path, standin_env: dict[str, str]
) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt")
    args = ["setup", "indextts2", "--python", sys.executable, "--model-dir", str(ckpt)]
    assert run_cli(args, standin_env).returncode == 0
    # Without the stand-in upstream on the path the doctor finds no IndexTTS in that venv.
    failed = run_cli(args)
    assert failed.returncode == 1
    line = failed.stderr.strip().splitlines()[-1]
    assert line.startswith("indextts-client setup: the doctor found a problem") and "fix:" in line
    record = read_record("indextts2")
    assert record is not None and not record.ready and record.error is not None and "doctor" in record.error
    assert run_cli(args, standin_env).returncode == 0
    repaired = read_record("indextts2")
    assert repaired is not None and repaired.ready and repaired.error is None


def test_the_checkpoints_beside_an_adopted_venv_are_found(tmp_path: Path) -> None:
    # The seed's parent keeps upstream in ${OMNIVOICE_INDEXTTS_DIR}/.venv with checkpoints/ beside it.
    checkout = tmp_path / "index-tts"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(checkout / ".venv")], check=True, timeout=120)
    ckpt = make_checkpoints(checkout / "checkpoints")
    python = checkout / ".venv" / "bin" / "python"
    # That venv sees this one's packages (indextts-sidecar at this version: nothing to install).
    site = next(p for p in sys.path if p.endswith("site-packages"))
    (next((checkout / ".venv" / "lib").glob("python*")) / "site-packages" / "outer.pth").write_text(site + "\n")
    result = run_cli(["setup", "indextts2", "--python", str(python), "--no-verify"])
    assert result.returncode == 0, result.stderr
    assert f"found the checkpoints beside the venv: {ckpt}" in result.stderr
    record = read_record("indextts2")
    assert record is not None and record.ready and record.model_dir == str(ckpt) and record.python == str(python)


def test_adopting_a_bare_venv_installs_this_distribution_into_it(tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    ckpt = make_checkpoints(tmp_path / "ckpt")
    result = run_cli(["setup", "indextts2", "--python", str(python), "--model-dir", str(ckpt), "--no-verify"])
    assert result.returncode == 0, result.stderr
    assert f"installing indextts-sidecar {__version__} into {python}" in result.stderr
    version = subprocess.run(
        [str(python), "-c", "import indextts_sidecar; print(indextts_sidecar.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert version.stdout.strip() == __version__


def test_a_checkpoint_directory_of_the_other_version_is_refused(tmp_path: Path) -> None:
    ckpt25 = make_checkpoints(tmp_path / "ckpt25", version="2.5")
    result = run_cli(["setup", "indextts2", "--python", sys.executable, "--model-dir", str(ckpt25), "--no-verify"])
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"indextts-client setup: {ckpt25} holds IndexTTS-2.5 checkpoints, not IndexTTS-2: run "
        f"`indextts-client setup indextts2.5 --model-dir {ckpt25}`, or give an IndexTTS-2 directory"
    )
    record = read_record("indextts2")
    assert record is None or not record.ready


def test_an_incomplete_checkpoint_directory_names_what_it_lacks(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt", skip=("gpt.pth", "feat2.pt"))
    result = run_cli(["setup", "indextts2", "--python", sys.executable, "--model-dir", str(ckpt), "--no-verify"])
    assert result.returncode == 1
    assert f"{ckpt} lacks gpt.pth, feat2.pt" in result.stderr
    record = read_record("indextts2")
    assert record is not None and not record.ready


def _fake_python(folder: Path, version: str) -> Path:
    """A stand-in interpreter that reports ``version`` (what setup asks an interpreter)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"python{version}"
    major, minor = version.split(".")
    path.write_text(f"#!/bin/sh\necho {major} {minor}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_no_suitable_python_is_a_one_line_error(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    too_new = _fake_python(tmp_path / "bin", "3.13")
    given = run_cli(["setup", "indextts2", "--installer", "pip", "--venv", str(venv), "--base-python", str(too_new)])
    assert given.returncode == 1
    line = given.stderr.strip().splitlines()[-1]
    assert line.startswith(f"indextts-client setup: IndexTTS needs Python 3.10 or 3.11 and {too_new} is Python 3.13")
    assert "uv python install 3.11" in line
    # Nothing suitable on PATH either (only the 3.13 one).
    searched = run_cli(
        ["setup", "indextts2", "--installer", "pip", "--venv", str(venv)], {"PATH": str(tmp_path / "bin")}
    )
    assert searched.returncode == 1
    assert "IndexTTS needs Python 3.10 or 3.11 and none was found on PATH" in searched.stderr
    assert not venv.exists()
    record = read_record("indextts2")
    assert record is None or not record.ready


def test_an_adopted_interpreter_of_the_wrong_version_is_refused(tmp_path: Path) -> None:
    python = _fake_python(tmp_path / "bin", "3.12")
    result = run_cli(["setup", "indextts2", "--python", str(python), "--no-verify"])
    assert result.returncode == 1
    assert f"--python {python} is Python 3.12 and IndexTTS needs 3.10 or 3.11" in result.stderr


def test_a_source_that_is_no_upstream_checkout_is_refused(tmp_path: Path) -> None:
    result = run_cli(["setup", "indextts2", "--source", str(tmp_path), "--venv", str(tmp_path / "v")])
    assert result.returncode == 1
    assert "not a checkout of upstream IndexTTS" in result.stderr and os.fspath(tmp_path) in result.stderr


def test_without_huggingface_hub_a_download_names_the_extra(tmp_path: Path) -> None:
    hidden = (
        "import sys; sys.modules['huggingface_hub'] = None; from indextts_client._cli import main; "
        f"sys.exit(main(['setup', 'indextts2', '--python', {sys.executable!r}, '--no-verify']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", hidden], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 1
    assert "downloading needs huggingface_hub: pip install 'indextts-sidecar[cli]'" in result.stderr
    assert "Traceback" not in result.stderr
