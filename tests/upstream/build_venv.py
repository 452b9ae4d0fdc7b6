"""Build (once) and locate the venvs that run the real upstream IndexTTS code.

Usage::

    python tests/upstream/build_venv.py github          # builds if needed, prints the venv's python
    python tests/upstream/build_venv.py pypi
    python tests/upstream/build_venv.py github --check  # prints it only if already built (else exit 1)
    python tests/upstream/build_venv.py agents-pipecat  # a voice-agent framework's venv (.ci/agents)
    python tests/upstream/build_venv.py extras-server   # what pip install ".[server]" brings

Each flavour's venv holds upstream's pins (``pins-<flavour>.txt`` beside this file, ``pip freeze``
of venvs that ran upstream) plus this project's core requirements, so pip proves that
``indextts-sidecar`` fits inside them.  The project itself is not installed there: the
conformance suite puts the checkout under test on ``PYTHONPATH``, so one cached venv serves
every clone and every commit.

The voice-agent frameworks' venvs (``agents-<framework>``, one per ``tests/agents/<framework>/``
holding a ``requirements.txt``) add the ``server`` and ``espeak`` extras and the framework's own
extra where pyproject.toml has one: their tests spawn ``indextts-client serve --engine espeak``.

The documented installs' venvs (``extras-server``, ``extras-server-cli``, ``extras-wyoming-cli``:
what ``pip install ".[server]"``, ``".[server,cli]"`` and ``".[wyoming,cli]"`` bring, and nothing
else) hold the core requirements and those extras' requirements as pyproject.toml lists them,
without pins: tests/serving/test_start_checks.py starts ``serve``, ``wyoming`` and a ``Pool``
with them, the checkout on ``PYTHONPATH`` as above.

Venvs are cached under ``$INDEXTTS_SIDECAR_CACHE`` (default ``$XDG_CACHE_HOME/indextts-sidecar``,
or ``~/.cache/indextts-sidecar``) in ``venvs/<flavour>-<hash>``, the hash covering everything that
decides their content (pins, core and extras' requirements, interpreter version).  Only the first run pays
(PyPI's torch brings the CUDA libraries: several GB and minutes); a change of pins builds a new
venv.  A build that died half-way is redone; concurrent builds of one venv wait on a lock.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
#: Each venv's pins: upstream's two, and Ray's (its own venv: Ray is large and optional).
PINS = {
    "github": HERE / "pins-github.txt",
    "pypi": HERE / "pins-pypi.txt",
    "ray": ROOT / "tests" / "ray_serve" / "requirements.txt",
}
#: The voice-agent frameworks' venvs: every tests/agents/<framework>/requirements.txt.
AGENTS = ROOT / "tests" / "agents"
PINS.update({f"agents-{req.parent.name}": req for req in sorted(AGENTS.glob("*/requirements.txt"))})
#: The documented installs' venvs: the extras each brings (pyproject.toml resolves the rest).
EXTRAS = {
    "extras-server": ["server"],
    "extras-server-cli": ["server", "cli"],
    "extras-wyoming-cli": ["wyoming", "cli"],
    "extras-test": ["test"],  # .ci/pythons: the suites on other Pythons
}
FLAVOURS = (*PINS, *EXTRAS)
#: Upstream requires Python >= 3.10, < 3.12 (its pyproject.toml); so does this project's
#: oldest supported Python.  The agent frameworks need 3.11 (pipecat-ai's Requires-Python).
#: The extras' venvs take any Python the project supports (requires-python).
SUPPORTED = ((3, 10), (3, 11))
PROJECT_SUPPORTED = (3, 10)
AGENTS_SUPPORTED = ((3, 11), (3, 12), (3, 13))
MARKER = ".complete"


def cache_root() -> Path:
    explicit = os.environ.get("INDEXTTS_SIDECAR_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "indextts-sidecar"


def core_requirements() -> list[str]:
    """This project's runtime requirements, read from pyproject.toml (no TOML parser on 3.10)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    if block is None:
        raise SystemExit("pyproject.toml: no dependencies list")
    return re.findall(r'"([^"]+)"', block.group(1))


def extra_requirements(names: list[str]) -> list[str]:
    """The requirements of pyproject.toml's extras ``names`` (those it has), the project's own
    extras they name (``indextts-sidecar[realtime]``) resolved in turn."""
    text = (ROOT / "pyproject.toml").read_text()
    out: list[str] = []
    pending, seen = list(names), set()
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        block = re.search(rf"^{re.escape(name)} = \[(.*?)\]$", text, re.S | re.M)
        if block is None:
            continue
        for requirement in re.findall(r'"([^"]+)"', block.group(1)):
            own = re.fullmatch(r"indextts-sidecar\[([^\]]+)\]", requirement)
            if own:
                pending.extend(part.strip() for part in own.group(1).split(","))
            elif requirement not in out:
                out.append(requirement)
    return out


def requirements(flavour: str) -> list[str]:
    """What a flavour's venv gets besides its pins: the core; for agents and the documented
    installs, the extras too."""
    core = core_requirements()
    if flavour in EXTRAS:
        core += extra_requirements(EXTRAS[flavour])
    if flavour.startswith("agents-"):
        core += extra_requirements(["server", "espeak", flavour.removeprefix("agents-")])
    return core


def find_interpreter(flavour: str = "github") -> str:
    """An interpreter the flavour supports: this one, else the newest supported one on PATH."""
    if flavour in EXTRAS:
        if sys.version_info[:2] >= PROJECT_SUPPORTED:
            return sys.executable
        raise SystemExit(f"the {flavour} venv needs Python >= 3.10 (the project's requires-python)")
    supported = AGENTS_SUPPORTED if flavour.startswith("agents-") else SUPPORTED
    if sys.version_info[:2] in supported:
        return sys.executable
    for major, minor in reversed(supported):
        path = shutil.which(f"python{major}.{minor}")
        if path:
            return path
    names = " or ".join(f"{major}.{minor}" for major, minor in supported)
    raise SystemExit(f"the {flavour} venv needs Python {names}; none found on PATH")


def interpreter_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def venv_dir(flavour: str, python: str) -> tuple[Path, list[str]]:
    pins = PINS[flavour].read_text() if flavour in PINS else ""
    core = requirements(flavour)
    key = "\n".join([flavour, interpreter_version(python), pins, *core])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "venvs" / f"{flavour}-{digest}", core


def venv_python(path: Path) -> Path:
    return path / "bin" / "python"


def build(flavour: str, python: str) -> Path:
    path, core = venv_dir(flavour, python)
    if (path / MARKER).exists():
        return venv_python(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / MARKER).exists():  # built by whoever held the lock
            return venv_python(path)
        if path.exists():
            print(f"removing an unfinished build: {path}", file=sys.stderr)
            shutil.rmtree(path)
        print(f"building the {flavour} venv in {path} (first run only)", file=sys.stderr)
        subprocess.run([python, "-m", "venv", str(path)], check=True)
        pip = [str(venv_python(path)), "-m", "pip", "--disable-pip-version-check", "--no-input"]
        log = path / "build.log"
        _run([*pip, "install", "--upgrade", "pip"], log)
        pinned = ["-r", str(PINS[flavour])] if flavour in PINS else []
        _run([*pip, "install", *pinned, *core], log)
        (path / MARKER).write_text("ok\n")
    return venv_python(path)


def _run(command: list[str], log: Path) -> None:
    """Runs ``command`` with its output in ``log``; on failure shows the log's end and exits."""
    with open(log, "ab") as out:
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    if status:
        lines = log.read_text(errors="replace").splitlines()
        tail = [line for line in lines if "is ignored: it is neither a file" not in line][-40:]
        print("\n".join(tail), file=sys.stderr)
        raise SystemExit(f"{' '.join(command[:4])}... failed with exit status {status}; full log: {log}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("flavour", choices=FLAVOURS)
    parser.add_argument("--check", action="store_true", help="do not build; exit 1 unless built")
    parser.add_argument("--python", help="the interpreter to build the venv from (3.10 or 3.11)")
    args = parser.parse_args(argv)
    python = args.python or find_interpreter(args.flavour)
    if args.check:
        path, _ = venv_dir(args.flavour, python)
        if not (path / MARKER).exists():
            return 1
        print(venv_python(path))
        return 0
    print(build(args.flavour, python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
