"""The distribution: python -m build gives an sdist and a wheel that twine check passes."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from harness import REPO

import indextts_client
import indextts_sidecar

pytestmark = pytest.mark.timeout(300)


def test_one_version_everywhere() -> None:
    assert indextts_client.__version__ == indextts_sidecar.__version__ == metadata.version("indextts-sidecar")
    pyproject = (Path(REPO) / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and "\nversion =" not in pyproject


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build")
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the build backend comes from this venv (the dev extra), not a download.
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), REPO],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_build_gives_an_sdist_and_a_wheel_that_twine_accepts(dist: Path) -> None:
    pytest.importorskip("twine")
    version = indextts_sidecar.__version__
    names = sorted(p.name for p in dist.iterdir())
    assert names == [f"indextts_sidecar-{version}-py3-none-any.whl", f"indextts_sidecar-{version}.tar.gz"]
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2


def test_the_wheel_is_typed_mit_and_keeps_gpl_code_in_an_extra(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        files = set(archive.namelist())
        info = next(name for name in files if name.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(archive.read(info).decode())
    assert {"indextts_client/py.typed", "indextts_sidecar/py.typed"} <= files
    assert "indextts_client/http/static/playground.html" in files  # the playground, served at /
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in files)
    assert meta["Version"] == indextts_sidecar.__version__ and meta["License-Expression"] == "MIT"
    core = [req for req in meta.get_all("Requires-Dist") or [] if "extra ==" not in req]
    assert sorted(req.split(">")[0].split(";")[0] for req in core) == ["anyio", "exceptiongroup", "msgspec", "numpy"]
    # espeakng-loader ships libespeak-ng (GPL-3.0): only ever through an extra.
    assert all("extra ==" in req for req in meta.get_all("Requires-Dist") or [] if req.startswith("espeakng"))
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    wanted = {"pyproject.toml", "README.md", "LICENSE", "indextts_client/py.typed", "indextts_sidecar/py.typed"}
    assert wanted <= members
