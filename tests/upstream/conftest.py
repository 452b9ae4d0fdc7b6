"""The conformance suite: the real upstream IndexTTS code behind a real sidecar.

These tests need a venv with upstream's pins (torch, transformers...), which the
project's own test venv never has.  They run when the venv's interpreter is named:

* ``INDEXTTS_UPSTREAM_PYTHON``: a venv built by ``build_venv.py github``; the flavours
  ``2`` and ``2.5`` import the GitHub checkout (``INDEXTTS_UPSTREAM_SRC``, default
  ``../shared/upstream/index-tts`` beside this repository) through ``PYTHONPATH``;
* ``INDEXTTS_PYPI_PYTHON``: a venv built by ``build_venv.py pypi`` (``indextts2-inference``
  2.1.1 and ``indextts25-inference`` 0.2.0 installed).

Otherwise every test here is skipped, with the reason printed.  ``.ci/upstream`` builds
(or reuses) both venvs and runs this suite.  Checkpoints are tiny random models built by
``fixture.py`` inside the venv (seconds; nothing downloaded), kept beside the venvs under a
fingerprint of the builder, the pins and the upstream code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import select
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


@dataclass(frozen=True)
class Flavour:
    """One way users get upstream: which venv, which import path, which checkpoint kind."""

    name: str  # "2", "2.5", "pypi2", "pypi2.5"
    python: str
    checkout: str | None  # the GitHub checkout on PYTHONPATH, or None (installed package)
    engine: str  # the sidecar engine that runs it
    #: The venv's own interpreter, where ``python`` is the fork server's launcher (else ``python``).
    real_python: str = ""

    def __post_init__(self) -> None:
        if not self.real_python:
            object.__setattr__(self, "real_python", self.python)

    @property
    def pypi(self) -> bool:
        return self.checkout is None

    def env(self, **extra: str) -> dict[str, str]:
        """The sidecar's environment: this checkout (and upstream's) importable, nothing online."""
        paths = [str(ROOT)] + ([self.checkout] if self.checkout else [])
        env = {"PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        # Read at start-up, and set by bench_gpu.py for its sidecars: one fork server serves both.
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env


def expected_openmp() -> dict[str, str]:
    """What a load reports as ``openmp``: the OpenMP wait variables this environment sets, or
    the sidecar's bound on the spinning (``GOMP_SPINCOUNT=1000``) where it sets none."""
    waits = {name: os.environ[name] for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if name in os.environ}
    return waits or {"GOMP_SPINCOUNT": "1000"}


def upstream_src() -> str:
    src = os.environ.get("INDEXTTS_UPSTREAM_SRC") or str(ROOT.parent / "shared" / "upstream" / "index-tts")
    return os.path.abspath(src)


def _python(variable: str, flavour: str) -> str:
    python = os.environ.get(variable)
    if not python:
        pytest.skip(
            f"{variable} is not set: the {flavour} conformance tests need upstream's venv "
            f"(`python tests/upstream/build_venv.py {flavour}` builds it; .ci/upstream runs this suite)"
        )
    if not os.access(python, os.X_OK):
        pytest.fail(f"{variable}={python} is not an executable interpreter")
    return python


def flavour_named(name: str) -> Flavour:
    if name in ("2", "2.5"):
        python = _python("INDEXTTS_UPSTREAM_PYTHON", "github")
        src = upstream_src()
        if not os.path.isfile(os.path.join(src, "indextts", "infer_v2.py")):
            pytest.fail(f"no upstream checkout at {src} (set INDEXTTS_UPSTREAM_SRC)")
        flavour = Flavour(name, python, src, "indextts2" if name == "2" else "indextts2.5")
        return _forked(flavour, ("indextts.infer_v2", "indextts.infer_v2_5"))
    python = _python("INDEXTTS_PYPI_PYTHON", "pypi")
    flavour = Flavour(name, python, None, "indextts2" if name == "pypi2" else "indextts2.5")
    return _forked(flavour, ("indextts.infer_v2", "indextts25.infer_v2_5"))


#: One fork server a venv in this process (``forkserver.py``): its process, its directory.
_FORKSERVERS: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
FORKSERVER_READY_TIMEOUT = 300.0


def _forked(flavour: Flavour, modules: tuple[str, ...]) -> Flavour:
    """The flavour with its interpreter behind a fork server (``INDEXTTS_UPSTREAM_FORKSERVER=0``: as it is).

    Flavours of one venv share an environment (``Flavour.env`` differs only in the checkout, the
    same for both GitHub flavours), so they share one server, started at the first use.
    """
    if os.environ.get("INDEXTTS_UPSTREAM_FORKSERVER") == "0":
        return flavour
    if flavour.python not in _FORKSERVERS:
        _FORKSERVERS[flavour.python] = _start_forkserver(flavour, modules)
    directory = _FORKSERVERS[flavour.python][1]
    return dataclasses.replace(flavour, python=str(directory / "python"), real_python=flavour.python)


def forkserver_log(flavour: Flavour) -> Path:
    """The log of the fork server behind ``flavour``: a line for each start, forked or cold and why."""
    return _FORKSERVERS[flavour.real_python][1] / "log"


def _start_forkserver(flavour: Flavour, modules: tuple[str, ...]) -> tuple[subprocess.Popen[bytes], Path]:
    from forkserver import write_launcher

    directory = Path(tempfile.mkdtemp(prefix="indextts-fs-"))
    socket_path = str(directory / "socket")
    log = directory / "log"
    with open(log, "wb") as stderr:
        server = subprocess.Popen(
            [flavour.python, str(HERE / "forkserver.py"), "serve", socket_path, *modules],
            env={**os.environ, **flavour.env()},
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )
    assert server.stdout is not None
    ready, _, _ = select.select([server.stdout], [], [], FORKSERVER_READY_TIMEOUT)
    line = server.stdout.readline() if ready else b""
    if line != b"ready\n":
        server.kill()
        server.wait()
        pytest.fail(f"the fork server for {flavour.python} did not start: {log.read_text()[-3000:]}")
    write_launcher(directory, socket_path, flavour.python)
    return server, directory


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop this process's fork servers: a SIGTERM ends each once its children are killed."""
    while _FORKSERVERS:
        _, (server, directory) = _FORKSERVERS.popitem()
        if server.stdout is not None:
            server.stdout.close()
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _fingerprint(flavour: Flavour) -> str:
    """What decides a fixture's content: the builder, the venv's pins, the upstream code."""
    digest = hashlib.sha256()
    digest.update(flavour.name.encode())
    digest.update((HERE / "fixture.py").read_bytes())
    digest.update((HERE / f"pins-{'pypi' if flavour.pypi else 'github'}.txt").read_bytes())
    if flavour.checkout:
        for path in sorted(Path(flavour.checkout, "indextts").rglob("*.py")):
            digest.update(str(path.relative_to(flavour.checkout)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build_checkpoint(flavour: Flavour, out: Path) -> Path:
    """Run fixture.py in the flavour's venv; returns the checkpoint directory."""
    command = [flavour.python, str(HERE / "fixture.py"), flavour.name, str(out)]
    if flavour.checkout:
        command += ["--src", flavour.checkout]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": flavour.checkout or ""}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        pytest.fail(f"building the {flavour.name} fixture failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return out


def cached_checkpoint(flavour: Flavour, scratch: Path) -> Path:
    """The flavour's fixture, built once per content fingerprint and kept beside the venvs.

    The builder is seeded, so a fixture is a function of its fingerprint; keeping it saves
    the 10-50 s each build takes (the PyPI packages load full state dicts).  Set
    ``INDEXTTS_FIXTURE_CACHE=0`` to build afresh into the test's temporary directory.
    """
    if os.environ.get("INDEXTTS_FIXTURE_CACHE") == "0":
        return build_checkpoint(flavour, scratch / "ckpt")
    from build_venv import cache_root

    final = cache_root() / "fixtures" / f"{flavour.name}-{_fingerprint(flavour)}"
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        build_checkpoint(flavour, partial)
        os.rename(partial, final)  # atomic; a concurrent builder's rename wins the same content
    except OSError:
        if not final.is_dir():
            raise
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
    return final


_CHECKPOINTS: dict[str, Path] = {}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``checkpoints(flavour)`` -> that flavour's checkpoint directory, built once per session."""

    def get(flavour: Flavour) -> Path:
        if flavour.name not in _CHECKPOINTS:
            scratch = tmp_path_factory.mktemp(f"ckpt-{flavour.name}")
            _CHECKPOINTS[flavour.name] = cached_checkpoint(flavour, scratch)
        return _CHECKPOINTS[flavour.name]

    return get


#: This suite's files, longest first (seconds on 2 cores, caches warm, beside one other file):
#: .ci/upstream hands whole files to two pytest-xdist workers in this order
#: (``--no-loadscope-reorder``), so that the longest start first and the short ones fill in
#: around them, not left for one worker alone at the end.  A file not named here goes last.
LONGEST_FIRST = (
    "test_bench_gpu.py",  # 460-690 s: every bench cell for both models
    "test_setup.py",  # 160 s; 620 s where its venvs are built first
    "test_conformance.py",
    "test_upstream_batching.py",
    "test_upstream_joining.py",
    "test_gpt_fast.py",
    "test_profile.py",
    "test_prefix_cache.py",
    "test_ssml_tokens.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slots = [index for index, item in enumerate(items) if HERE in Path(str(item.fspath)).parents]
    for index in slots:
        items[index].add_marker(pytest.mark.upstream)

    def rank(item: pytest.Item) -> int:
        name = Path(str(item.fspath)).name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    # The suite's own items change places among themselves; every other item keeps its place.
    ordered = sorted((items[index] for index in slots), key=rank)
    for index, item in zip(slots, ordered, strict=True):
        items[index] = item
