"""Build (once) and locate the venvs that run the real upstream IndexTTS code.

Usage::

    python tests/upstream/build_venv.py github          # builds if needed, prints the venv's python
    python tests/upstream/build_venv.py pypi
    python tests/upstream/build_venv.py github --check  # prints it only if already built (else exit 1)

Each flavour's venv holds upstream's pins (``pins-<flavour>.txt`` beside this file, ``pip freeze``
of venvs that ran upstream) plus this project's core requirements, so pip proves that
``indextts-sidecar`` fits inside them.  The project itself is not installed there: the
conformance suite puts the checkout under test on ``PYTHONPATH``, so one cached venv serves
every clone and every commit.

Venvs are cached under ``$INDEXTTS_SIDECAR_CACHE`` (default ``$XDG_CACHE_HOME/indextts-sidecar``,
or ``~/.cache/indextts-sidecar``) in ``venvs/<flavour>-<hash>``, the hash covering everything that
decides their content (pins, core requirements, interpreter version).  Only the first run pays
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
FLAVOURS = tuple(PINS)
#: Upstream requires Python >= 3.10, < 3.12 (its pyproject.toml).
SUPPORTED = ((3, 10), (3, 11))
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


def find_interpreter() -> str:
    """An interpreter upstream supports: this one, else python3.11 / python3.10 on PATH."""
    if sys.version_info[:2] in SUPPORTED:
        return sys.executable
    for name in ("python3.11", "python3.10"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("upstream IndexTTS needs Python 3.10 or 3.11; none found on PATH")


def interpreter_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def venv_dir(flavour: str, python: str) -> tuple[Path, list[str]]:
    pins = PINS[flavour].read_text()
    core = core_requirements()
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
        _run([*pip, "install", "-r", str(PINS[flavour]), *core], log)
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
    python = args.python or find_interpreter()
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
