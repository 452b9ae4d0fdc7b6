"""``indextts-client setup`` for real: a venv built from upstream's checkout, then ``say`` with no --python.

setup builds the engine venv from the upstream snapshot (``INDEXTTS_UPSTREAM_SRC``) as a local
source, with torch from the ordinary package index (``--torch pypi``: PyTorch's own index is
not reachable in CI) and pip (whose cache and wheel directories already hold what the github
venv was built from: minutes, not a second torch download; uv would fill a cache of its own),
constrained to the github venv's pins.  The checkpoints are the tiny random ones of the
conformance suite, given with ``--model-dir``; setup's verification runs the doctor and one
synthesis on the CPU.  Then ``say --engine indextts2`` finds the environment in the registry.

The same with uv, the default installer, and ``--torch pypi``: uv must not follow the checkout's
``[tool.uv.sources]`` to PyTorch's index (``--no-sources``); torch is PyPI's build.

It needs INDEXTTS_UPSTREAM_PYTHON (the github venv, which builds the fixture) and is skipped,
saying why, without it.  Set ``INDEXTTS_SETUP_VENV`` (pip) and ``INDEXTTS_SETUP_UV_VENV`` (uv)
to keep the built venvs between runs (setup then repairs each in place, which takes seconds).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import pytest
from conftest import HERE, ROOT, flavour_named, upstream_src

#: A venv build installs several GB (from pip's cache): a bound, not an expectation.
SETUP_LIMIT = 1800


def _cli(args: list[str], env: dict[str, str], limit: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "indextts_client", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=limit,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )


def _setup_from_checkout(
    installer: str, venv: str, home: Path, ckpt: Path, *, verify: bool = True
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """``setup indextts2`` from the checkout with ``installer`` and --torch pypi, offline, into ``venv``,
    which must succeed (and verify with one synthesis); returns its result and the environment it ran with."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_ENDPOINT")}
    env.update({"INDEXTTS_HOME": str(home), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    base = subprocess.run(
        [flavour_named("2").python, "-c", "import sys; print(sys._base_executable)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    args = ["setup", "indextts2", "--source", upstream_src(), "--torch", "pypi", "--installer", installer]
    args += ["--base-python", base, "--venv", venv, "--constraint", str(HERE / "pins-github.txt")]
    setup = _cli([*args, "--model-dir", str(ckpt), *([] if verify else ["--no-verify"])], env, SETUP_LIMIT)
    sys.stderr.write(setup.stderr[-4000:])
    assert setup.returncode == 0, setup.stderr[-4000:]
    assert ("samples at 22050 Hz on cpu" in setup.stderr) == verify  # the verification's synthesis
    return setup, env


@pytest.mark.timeout(SETUP_LIMIT + 300)
def test_setup_from_the_checkout_then_say_finds_the_environment(checkpoints: object, tmp_path: Path) -> None:
    flavour = flavour_named("2")
    ckpt = checkpoints(flavour)  # type: ignore[operator]
    home = tmp_path / "home"
    venv = os.environ.get("INDEXTTS_SETUP_VENV") or str(tmp_path / "venv")
    setup, env = _setup_from_checkout("pip", venv, home, ckpt)
    assert setup.stdout.strip().startswith("indextts2 is ready: ")

    listed = _cli(["envs", "--json"], env, 60)
    assert f'"engine":"indextts2","python":"{venv}/bin/python"' in listed.stdout
    assert '"status":"ready"' in listed.stdout and '"verified":true' in listed.stdout

    out = tmp_path / "hello.wav"
    fast = ["--set", "max_mel_tokens=12", "--set", "num_beams=1", "--ready-timeout", "300", "-q"]
    voice = str(ckpt / "voice.wav")
    say = _cli(["say", "Hello there.", "--engine", "indextts2", "--voice", voice, "-o", str(out), *fast], env, 600)
    assert say.returncode == 0, say.stderr[-4000:]
    with wave.open(str(out)) as w:
        assert w.getframerate() == 22050 and w.getnchannels() == 1
        assert w.getnframes() > 0

    # The doctor, too, finds the environment (it judges upstream's defaults, so the tiny fixture's
    # missing Qwen folder is a problem there: exit 1, not 2).
    doctor = _cli(["doctor", "--engine", "indextts2"], env, 600)
    assert doctor.returncode in (0, 1) and f"{venv}/bin/python" in doctor.stdout, doctor.stdout[-4000:]

    # The hub path with the real code: the tiny checkpoints served by a loopback hub (the main
    # repository and the four auxiliary ones), fetched into INDEXTTS_HOME by adopting the venv
    # just built, then verified by a synthesis that loads them from where setup put them.
    sys.path.insert(0, str(ROOT / "tests" / "setup"))
    from hub_support import Hub

    with Hub(_fixture_repos(ckpt)).running() as hub:
        online = {**env, "HF_ENDPOINT": hub.url}
        online.pop("HF_HUB_OFFLINE")
        fetched = _cli(["setup", "indextts2", "--python", f"{venv}/bin/python"], online, 1200)
        assert fetched.returncode == 0, fetched.stderr[-4000:]
        assert "samples at 22050 Hz on cpu" in fetched.stderr
    model_dir = home / "models" / "IndexTeam--IndexTTS-2"
    assert (model_dir / "hf_cache" / "bigvgan" / "bigvgan_generator.pt").is_file()
    assert f"with {model_dir}." in fetched.stdout

    if not os.environ.get("INDEXTTS_SETUP_VENV"):
        shutil.rmtree(venv)  # several GB: pytest keeps the last runs' temporary folders


@pytest.mark.timeout(SETUP_LIMIT + 300)
def test_setup_with_uv_takes_torch_from_where_torch_says(checkpoints: object, tmp_path: Path) -> None:
    """The default installer: uv, which by itself would follow the checkout's [tool.uv.sources] to
    PyTorch's cu128 index; with ``--torch pypi`` torch must come from the package index instead."""
    from indextts_client._setup._build import find_uv

    if find_uv() is None:
        pytest.skip("no uv binary (the cli extra installs it)")
    flavour = flavour_named("2")
    ckpt = checkpoints(flavour)  # type: ignore[operator]
    home = tmp_path / "home"
    venv = os.environ.get("INDEXTTS_SETUP_UV_VENV") or str(tmp_path / "venv")
    # Without the verification (the pip run above makes the same synthesis; CI's time is short):
    # what differs here is where torch came from, and that upstream's code imports with it.
    setup, _ = _setup_from_checkout("uv", venv, home, ckpt, verify=False)
    assert "preparing the venv" in setup.stderr and "(uv)" in setup.stderr
    log = (home / "logs" / "setup-indextts2.log").read_text()
    assert "pip install --no-sources" in log and "download.pytorch.org" not in log
    torch = subprocess.run(
        [f"{venv}/bin/python", "-c", "import importlib.metadata as m, indextts.infer_v2; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()[-1]
    assert torch.startswith("2.") and "+" not in torch, torch  # PyPI's build, not PyTorch's +cu128/+cpu
    if not os.environ.get("INDEXTTS_SETUP_UV_VENV"):
        shutil.rmtree(venv)


def _fixture_repos(ckpt: Path) -> dict[str, Any]:
    """The conformance fixture as the hub's repositories: IndexTeam/IndexTTS-2 and the auxiliary ones."""
    from hub_support import Repo

    def read(*parts: str) -> bytes:
        return ckpt.joinpath(*parts).read_bytes()

    main = {
        str(path.relative_to(ckpt)): path.read_bytes()
        for path in sorted(ckpt.rglob("*"))
        if path.is_file() and "hf_cache" not in path.parts and not path.name.startswith("voice")
    }
    codec = read("hf_cache", "semantic_codec_model.safetensors")
    w2v = {path.name: path.read_bytes() for path in (ckpt / "hf_cache" / "w2v-bert-2.0").iterdir() if path.is_file()}
    return {
        "IndexTeam/IndexTTS-2": Repo(main),
        "facebook/w2v-bert-2.0": Repo(w2v),
        "amphion/MaskGCT": Repo({"semantic_codec/model.safetensors": codec}),
        "funasr/campplus": Repo({"campplus_cn_common.bin": read("hf_cache", "campplus_cn_common.bin")}),
        "nvidia/bigvgan_v2_22khz_80band_256x": Repo(
            {name: read("hf_cache", "bigvgan", name) for name in ("config.json", "bigvgan_generator.pt")}
        ),
    }
