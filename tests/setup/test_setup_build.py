"""setup building a venv: from a local checkout (a small stand-in for upstream's), with uv and with pip.

The stand-in checkout is a package named ``indextts`` with no dependencies, so the build takes
seconds and no torch; what is checked is the venv, what is installed into it, and the record.
The real checkout, with torch, is tests/upstream/test_setup.py.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli
from harness import REPO, make_checkpoints

from indextts_client._registry import read_record
from indextts_client._setup._build import find_uv, lock_constraints
from indextts_sidecar import __version__

UPSTREAM = Path(REPO).parent / "shared" / "upstream" / "index-tts"


def _checkout(root: Path, dead_index: str = "http://127.0.0.1:9/simple") -> Path:
    """A stand-in checkout whose [tool.uv.sources] sends a dependency to an index nobody serves, as
    upstream's sends torch to PyTorch's cu128 index: setup must take it from the ordinary index."""
    (root / "indextts").mkdir(parents=True)
    (root / "indextts" / "__init__.py").write_text("")
    (root / "indextts" / "infer_v2.py").write_text("class IndexTTS2: ...\n")
    (root / "pyproject.toml").write_text(
        '[project]\nname = "indextts"\nversion = "2.0.0"\nrequires-python = ">=3.10,<3.12"\n'
        'dependencies = ["packaging"]\n'
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[tool.uv.sources]\npackaging = [{ index = "unreachable" }]\n'
        f'[[tool.uv.index]]\nname = "unreachable"\nurl = "{dead_index}"\nexplicit = true\n'
    )
    return root


# uv only: pip's path (slower by a minute here) is the one tests/upstream/test_setup.py builds with.
@pytest.mark.parametrize("installer", ["uv"])
@pytest.mark.timeout(600)
def test_a_venv_is_built_from_a_local_checkout(tmp_path: Path, installer: str) -> None:
    if installer == "uv" and find_uv() is None:
        pytest.skip("no uv binary (the cli extra installs it)")
    checkout = _checkout(tmp_path / "index-tts")
    venv = tmp_path / "venv"
    ckpt = make_checkpoints(tmp_path / "ckpt")
    args = ["setup", "indextts2", "--source", str(checkout), "--installer", installer, "--torch", "pypi"]
    args += ["--venv", str(venv), "--model-dir", str(ckpt), "--no-verify"]
    result = run_cli(args)
    assert result.returncode == 0, result.stderr
    assert f"preparing the venv {venv} ({'uv' if installer == 'uv' else 'venv + pip'})" in result.stderr
    python = venv / "bin" / "python"
    shown = subprocess.run(
        [str(python), "-c", "import indextts as u, indextts_sidecar as s; print(u.__file__, s.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert shown.returncode == 0, shown.stderr
    where, version = shown.stdout.split()
    assert version == __version__ and where.startswith(str(venv))  # installed, not imported from the checkout
    record = read_record("indextts2")
    assert record is not None and record.ready
    assert (record.python, record.venv, record.source) == (str(python), str(venv), str(checkout))

    # Again: the venv is kept and repaired in place; envs remove deletes it.
    again = run_cli(args)
    assert again.returncode == 0, again.stderr
    assert "preparing the venv" in again.stderr and python.exists()
    # --force rebuilds from scratch: what was in the venv before is gone, and it is ready again.
    stray = venv / "stray-file"
    stray.write_text("left by an earlier build")
    forced = run_cli([*args, "--force"])
    assert forced.returncode == 0, forced.stderr
    assert f"removing {venv} (--force)" in forced.stderr
    assert not stray.exists() and python.exists()
    record = read_record("indextts2")
    assert record is not None and record.ready
    assert run_cli(["envs", "remove", "indextts2"]).returncode == 0
    assert not venv.exists() and ckpt.exists()


@pytest.mark.skipif(not (UPSTREAM / "uv.lock").is_file(), reason="no upstream checkout beside the repository")
def test_upstreams_lock_becomes_constraints_without_its_torch_builds(tmp_path: Path) -> None:
    uv = find_uv()
    if uv is None:
        pytest.skip("no uv binary (the cli extra installs it)")
    path = lock_constraints(UPSTREAM, uv, tmp_path, tmp_path / "log")
    assert path is not None
    lines = path.read_text().splitlines()
    assert "transformers==4.52.1" in lines and "accelerate==1.8.1" in lines
    assert [line for line in lines if line.startswith(("torch==", "torchaudio==", "torchvision=="))] == []
    assert any(line.startswith("torch-stoi==") for line in lines)
    # What --constraint pins is left to it (two pins of one package would be unsatisfiable).
    mine = tmp_path / "mine.txt"
    mine.write_text("# my pins\nTransformers==4.52.1\nwetextprocessing==1.2.0 ; sys_platform == 'linux'\n")
    path = lock_constraints(UPSTREAM, uv, tmp_path, tmp_path / "log", [mine])
    assert path is not None
    left = path.read_text().splitlines()
    assert [line for line in left if line.lower().startswith(("transformers", "wetextprocessing"))] == []
    assert "accelerate==1.8.1" in left


@pytest.mark.timeout(600)
def test_a_first_setup_whose_install_fails_is_incomplete_and_names_the_host(tmp_path: Path, home: Path) -> None:
    uv = find_uv()
    if uv is None:
        pytest.skip("no uv binary (the cli extra installs it)")
    with socket.socket() as s:  # an index nobody serves
        s.bind(("127.0.0.1", 0))
        index = f"http://127.0.0.1:{s.getsockname()[1]}/simple"
    env = {"UV_DEFAULT_INDEX": index, "UV_HTTP_RETRIES": "0"}
    checkout = _checkout(tmp_path / "index-tts")
    args = ["setup", "indextts2", "--source", str(checkout), "--installer", "uv", "--torch", "pypi"]
    args += ["--venv", str(tmp_path / "venv"), "--model-dir", str(make_checkpoints(tmp_path / "ckpt")), "--no-verify"]
    log = home / "logs" / "setup-indextts2.log"
    cause = (
        "installing into the venv failed: cannot reach 127.0.0.1: check the network and the package index "
        f"(PIP_INDEX_URL for pip, UV_DEFAULT_INDEX for uv) (log: {log})"
    )
    shown = []
    for _ in range(2):
        result = run_cli(args, env)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1] == f"indextts-client setup: {cause}"
        record = read_record("indextts2")
        assert record is not None and record.status == "incomplete" and record.error == cause
        shown.append(result.stderr.count(index))
    # The lines shown are this run's: the second run shows as many as the first, not both runs'.
    assert shown[0] >= 1 and shown[1] == shown[0]
    assert log.read_text().count(index) > shown[1]
