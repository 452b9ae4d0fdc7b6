"""The engine's venv: an interpreter upstream accepts, upstream's code with its pins, torch, this distribution.

Everything heavy runs in subprocesses: uv where it is available (the ``uv`` distribution of
the ``cli`` extra ships the binary), else ``python -m venv`` and pip.  Their output goes to a
log file; a failure raises :class:`SetupError` with the log's last lines and the fix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from indextts_sidecar import __version__

__all__ = [
    "PYPI_DISTRIBUTIONS",
    "SUPPORTED_PYTHONS",
    "TORCH_INDEXES",
    "UPSTREAM_COMMIT",
    "UPSTREAM_GIT",
    "InstallPlan",
    "SetupError",
    "create_venv",
    "detect_gpu",
    "diagnose",
    "find_base_python",
    "find_uv",
    "install",
    "python_version",
    "self_requirement",
    "upstream_requirement",
    "venv_python",
]

#: Upstream's repository and the commit the conformance suite passes (tests/upstream).
UPSTREAM_GIT = "https://github.com/index-tts/index-tts"
UPSTREAM_COMMIT = "ee40fa7d6c6b8a2c7f06105f9f1e65775b74868c"
#: The PyPI repackagings, at the versions the conformance suite passes.
PYPI_DISTRIBUTIONS = {"indextts2": "indextts2-inference==2.1.1", "indextts2.5": "indextts25-inference==0.2.0"}
#: Upstream's ``requires-python = ">=3.10,<3.12"``.
SUPPORTED_PYTHONS = ((3, 10), (3, 11))
PYTHON_SPEC = ">=3.10,<3.12"
#: PyTorch's own indexes; ``pypi`` takes torch from the ordinary index (on Linux a CUDA build
#: that brings the CUDA libraries as wheels).  cu128 is upstream's choice (its tool.uv.sources).
TORCH_INDEXES = {"cpu": "https://download.pytorch.org/whl/cpu", "cuda": "https://download.pytorch.org/whl/cu128"}
_TORCH_LINE = re.compile(r"^(torch|torchaudio|torchvision)\s*==", re.IGNORECASE)
_LOG_TAIL = 25


class SetupError(Exception):
    """A step failed: the message is one line that names the fix."""


def find_uv() -> Union[str, None]:
    """The uv binary: the ``uv`` distribution's, else one on PATH."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return shutil.which("uv")
    try:
        return str(find_uv_bin())
    except FileNotFoundError:
        return shutil.which("uv")


def python_version(python: str) -> Union[tuple[int, int], None]:
    """``(major, minor)`` of an interpreter, or None when it does not run."""
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    if out.returncode != 0 or len(parts) != 2:
        return None
    return int(parts[0]), int(parts[1])


def _no_python(detail: str) -> SetupError:
    return SetupError(
        f"IndexTTS needs Python 3.10 or 3.11 and {detail}: install one (e.g. `uv python install 3.11`, "
        "or your system's python3.11 package) and run setup again, or pass --base-python PATH"
    )


def find_base_python(base: Union[str, None]) -> str:
    """The interpreter to build the venv from: ``base`` if given (checked), else one on PATH."""
    if base is not None:
        found = shutil.which(base) or base
        version = python_version(found)
        if version is None:
            raise _no_python(f"{base} does not run")
        if version not in SUPPORTED_PYTHONS:
            raise _no_python(f"{base} is Python {version[0]}.{version[1]}")
        return found
    for name in ("python3.11", "python3.10", "python3", "python"):
        path = shutil.which(name)
        if path and python_version(path) in SUPPORTED_PYTHONS:
            return path
    raise _no_python("none was found on PATH")


def detect_gpu() -> bool:
    """Whether an NVIDIA GPU is seen (a driver that answers), without torch."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return os.path.exists("/proc/driver/nvidia/gpus") and bool(os.listdir("/proc/driver/nvidia/gpus"))
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def self_requirement() -> str:
    """This distribution at the running version: its source folder when installed from one, else the index."""
    from importlib import metadata

    try:
        dist = metadata.distribution("indextts-sidecar")
        direct = dist.read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        direct = None
    if direct:
        try:
            url = json.loads(direct).get("url", "")
        except ValueError:
            url = ""
        if url.startswith("file://"):
            from urllib.parse import unquote, urlparse

            folder = unquote(urlparse(url).path)
            if os.path.isfile(os.path.join(folder, "pyproject.toml")):
                return folder
    return f"indextts-sidecar=={__version__}"


def upstream_requirement(engine: str, source: str) -> tuple[str, Union[Path, None]]:
    """Upstream's code as a requirement, and the checkout (whose ``uv.lock`` pins the rest) if local."""
    if source == "github":
        return f"indextts @ git+{UPSTREAM_GIT}@{UPSTREAM_COMMIT}", None
    if source == "pypi":
        return PYPI_DISTRIBUTIONS[engine], None
    checkout = Path(source).expanduser().resolve()
    if not (checkout / "pyproject.toml").is_file() or not (checkout / "indextts").is_dir():
        raise SetupError(
            f"--source {source}: not a checkout of upstream IndexTTS (no pyproject.toml and indextts/ there); "
            "give the folder of a clone of https://github.com/index-tts/index-tts, or --source github / pypi"
        )
    return str(checkout), checkout


@dataclass
class InstallPlan:
    """What goes into the venv, and with what."""

    python: Path
    requirements: list[str]
    torch: str
    uv: Union[str, None]
    constraints: list[Path] = field(default_factory=list)
    log: Union[Path, None] = None


#: What the installers print when they cannot reach a host (pip, uv, git, urllib3, reqwest).
_NETWORK = (
    "Failed to establish a new connection",
    "Could not resolve host",
    "Failed to connect to",
    "dns error",
    "Connection refused",
    "Network is unreachable",
    "error sending request",
    "Failed to fetch",
    "Failed to download",
    "Name or service not known",
    "Temporary failure in name resolution",
    "Max retries exceeded",
    "Could not fetch URL",
    "unable to access",
    "connection timed out",
    "Read timed out",
)
_HOST = (
    re.compile(r"Could not resolve host: ([A-Za-z0-9.-]+)"),
    re.compile(r"host='([A-Za-z0-9.-]+)'"),
    re.compile(r"https?://([A-Za-z0-9.-]+)"),
)
_REQUIREMENT = (
    re.compile(r"No matching distribution found for (\S+)"),
    re.compile(r"Because (\S+) was not found in the package registry"),
    re.compile(r"Because there is no version of (\S+)"),
    re.compile(r"(\S+) was not found in the package registry"),
)


def _unreachable(host: str) -> str:
    """The fix for a host the installer could not reach."""
    if host == "github.com" or host.endswith((".github.com", ".githubusercontent.com")):
        return (
            "--source github clones upstream from GitHub: use --source pypi, or --source PATH of a clone you have, "
            "or check that github.com can be reached"
        )
    if host == "download.pytorch.org":
        return "--torch pypi takes torch from the package index instead of PyTorch's, or check the network"
    return "check the network and the package index (PIP_INDEX_URL for pip, UV_DEFAULT_INDEX for uv)"


def diagnose(output: str) -> Union[str, None]:
    """The real cause of a failed install, read from the installer's own output; None when unknown."""
    lines = output.splitlines()
    if "externally-managed-environment" in output or "externally managed" in output:
        return (
            "the interpreter is an externally managed (system) Python, which takes no packages: build a venv "
            "(leave --python out) or give --python a venv's interpreter"
        )
    if "No module named pip" in output:
        return "that venv has no pip: use --installer uv (the cli extra ships it), or run `PYTHON -m ensurepip` there"
    if "No space left on device" in output:
        return "the disk is full: free space there, or build the venv elsewhere with --venv DIR"
    for line in lines:
        if any(word in line for word in _NETWORK):
            for pattern in _HOST:
                found = pattern.search(line)
                if found:
                    host = found.group(1).rstrip(".")
                    return f"cannot reach {host}: {_unreachable(host)}"
    if "No such file or directory: 'git'" in output or "Git executable not found" in output:
        return "git is not installed, and --source github needs it: install git, or use --source pypi or PATH"
    for line in lines:
        for pattern in _REQUIREMENT:
            found = pattern.search(line)
            if found:
                name = found.group(1).strip("`'\",;")
                return (
                    f"no version of {name} that fits was found on the package index: check the index, "
                    "the --constraint files and --torch (the index torch comes from)"
                )
    if "No solution found when resolving dependencies" in output or "ResolutionImpossible" in output:
        return "the requirements conflict (see the resolver's lines above): check the --constraint files"
    return None


def _run(command: Sequence[str], log: Path, what: str, fix: str) -> None:
    """Run ``command`` with its output appended to ``log``; on failure show this run's lines and the cause."""
    with open(log, "ab") as out:
        out.write(("\n$ " + " ".join(command) + "\n").encode())
        out.flush()
        start = out.tell()
        status = subprocess.run(list(command), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if status.returncode:
        with open(log, "rb") as f:
            f.seek(start)
            output = f.read().decode(errors="replace")
        tail = [line for line in output.splitlines() if "is ignored: it is neither a file" not in line][-_LOG_TAIL:]
        print("\n".join(tail), file=sys.stderr)
        cause = diagnose(output)
        if cause is None:
            raise SetupError(f"{what} failed (exit status {status.returncode}; log: {log}): {fix}")
        raise SetupError(f"{what} failed: {cause} (log: {log})")


def create_venv(venv: Path, base: Union[str, None], uv: Union[str, None], log: Path) -> Path:
    """A venv at ``venv`` (kept when it already runs a supported Python), returning its interpreter.

    ``venv`` must be new, an empty folder, or a venv (the caller checked what may be replaced).
    """
    python = venv_python(venv)
    if python.exists() and python_version(str(python)) in SUPPORTED_PYTHONS:
        return python
    if venv.is_dir() and not any(venv.iterdir()):
        venv.rmdir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    if uv is not None:
        # uv finds an interpreter in range, or fetches one where it may (UV_PYTHON_DOWNLOADS).
        spec = find_base_python(base) if base is not None else PYTHON_SPEC
        try:
            _run([uv, "venv", "--no-project", "--python", spec, str(venv)], log, "creating the venv", "")
        except SetupError as exc:
            host = re.search(r"cannot reach ([A-Za-z0-9.-]+):", str(exc))
            why = f"none is installed and uv cannot reach {host.group(1)} to fetch one" if host else "uv found none"
            raise _no_python(f"{why} (log: {log})") from None
    else:
        interpreter = find_base_python(base)
        _run([interpreter, "-m", "venv", str(venv)], log, "creating the venv", "see the log")
    return python


_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _names(lines: Sequence[str]) -> set[str]:
    """The normalized distribution names a requirements or constraints text pins."""
    found = (_NAME.match(line) for line in lines if not line.lstrip().startswith(("#", "-")))
    return {re.sub(r"[-_.]+", "-", m.group(1)).lower() for m in found if m}


def lock_constraints(
    checkout: Path, uv: Union[str, None], folder: Path, log: Path, given: Sequence[Path] = ()
) -> Union[Path, None]:
    """Upstream's ``uv.lock`` as pip constraints, torch left to the torch choice; None without uv or a lock.

    A package that one of the ``given`` constraint files (``--constraint``) pins is left to it:
    two pins of one package to different versions would make the install unsatisfiable."""
    if uv is None or not (checkout / "uv.lock").is_file():
        return None
    export = [uv, "export", "--frozen", "--no-hashes", "--no-header", "--no-annotate", "--no-emit-project"]
    out = subprocess.run(
        [*export, "--project", str(checkout)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if out.returncode:
        with open(log, "a") as f:
            f.write(out.stderr)
        return None
    pinned = _names([line for path in given for line in path.read_text(errors="replace").splitlines()])
    lines = [
        line
        for line in out.stdout.splitlines()
        if line.strip() and not _TORCH_LINE.match(line) and not (_names([line]) & pinned)
    ]
    path = folder / "upstream-lock-constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def install(plan: InstallPlan) -> None:
    """Install ``plan.requirements`` (with torch from the chosen index) into the venv."""
    assert plan.log is not None
    extra: list[str] = []
    if plan.uv is not None:
        # --no-sources: a local checkout's [tool.uv.sources] (upstream's sends torch, torchaudio and
        # torchvision to PyTorch's cu128 index) must not overrule --torch.
        command = [plan.uv, "pip", "install", "--no-sources", "--python", str(plan.python)]
        if plan.torch in TORCH_INDEXES:
            # Best match across both indexes: torch's +cpu/+cu128 builds, everything else from the default.
            extra = ["--index", TORCH_INDEXES[plan.torch], "--index-strategy", "unsafe-best-match"]
    else:
        command = [str(plan.python), "-m", "pip", "--disable-pip-version-check", "--no-input", "install"]
        if plan.torch in TORCH_INDEXES:
            extra = ["--extra-index-url", TORCH_INDEXES[plan.torch]]
    for constraint in plan.constraints:
        extra += ["-c", str(constraint)]
    _run([*command, *extra, *plan.requirements], plan.log, "installing into the venv", "see the lines above")
