"""setup's cheap checks, run before anything is installed or deleted.

The interpreter to adopt (a venv, not a system Python), the venv target (new, empty, a
working venv, or one setup built: its marker), the base interpreter, the free space, the
checkpoints on disk or the hub repository (known, granted, and fitting on the disk).  Each
failure is a :class:`SetupError` whose one line names the fix; the result is a :class:`Plan`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import msgspec

from .._registry import home_problem, indextts_home, marker_problem
from ._build import (
    SUPPORTED_PYTHONS,
    SetupError,
    detect_gpu,
    find_base_python,
    python_version,
    upstream_requirement,
    venv_python,
)

__all__ = [
    "VENV_BYTES",
    "VERSION_OF",
    "Plan",
    "adopted_checkpoints",
    "check_checkpoints",
    "missing",
    "need_hub",
    "offline",
    "preflight",
    "usable_home",
    "works",
]

VERSION_OF = {"indextts2": "2", "indextts2.5": "2.5"}
_ENGINE_OF = {"2": "indextts2", "2.5": "indextts2.5"}


def adopted_checkpoints(python: str) -> Union[Path, None]:
    """``checkpoints/`` beside an adopted venv (upstream's layout: ``<checkout>/.venv``, ``<checkout>/checkpoints``)."""
    venv = Path(python).absolute().parent.parent
    candidate = venv.parent / "checkpoints"
    return candidate if (candidate / "config.yaml").is_file() else None


def need_hub() -> None:
    """Downloads need huggingface_hub (the cli extra): say so instead of a traceback."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise SetupError(
            "downloading needs huggingface_hub: pip install 'indextts-sidecar[cli]' (or huggingface_hub), "
            "or pass --model-dir a directory that holds the checkpoints and hf_cache/"
        ) from None


def _check_model_dir(model_dir: Path, engine: str) -> None:
    from indextts_sidecar.engines.indextts import checkpoint_version

    if not model_dir.is_dir():
        raise SetupError(f"--model-dir {model_dir}: no such directory; give the folder that holds config.yaml")
    version = checkpoint_version(str(model_dir))
    wanted = VERSION_OF[engine]
    if version is not None and version != wanted:
        other = _ENGINE_OF[version]
        raise SetupError(
            f"{model_dir} holds IndexTTS-{version} checkpoints, not IndexTTS-{wanted}: run "
            f"`indextts-client setup {other} --model-dir {model_dir}`, or give an IndexTTS-{wanted} directory"
        )


def missing(model_dir: Path, engine: str, *, aux: bool) -> list[str]:
    from indextts_sidecar.engines.indextts import missing_checkpoints

    return missing_checkpoints(str(model_dir), version=VERSION_OF[engine], qwen_emo=False, aux=aux)


#: Free space a new venv needs under its folder: torch with the CUDA libraries (cuda, pypi on
#: Linux) is several GB, the CPU build under one; the rest of upstream's pins about 1 GB.
VENV_BYTES = {"cpu": 3 * 10**9, "cuda": 10 * 10**9, "pypi": 10 * 10**9, "none": 10**8}

_PROBE = (
    "import importlib.util, json, os, sys, sysconfig\n"
    "stdlib = sysconfig.get_path('stdlib') or ''\n"
    "print(json.dumps({'venv': sys.prefix != sys.base_prefix,"
    " 'conda': os.path.isdir(os.path.join(sys.prefix, 'conda-meta')),"
    " 'managed': os.path.isfile(os.path.join(stdlib, 'EXTERNALLY-MANAGED')),"
    " 'pip': importlib.util.find_spec('pip') is not None}))\n"
)


class _Interpreter(msgspec.Struct):
    venv: bool
    conda: bool
    managed: bool
    pip: bool


def _probe(python: str, given: str) -> _Interpreter:
    try:
        out = subprocess.run(
            [python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
        )
        return msgspec.json.decode(out.stdout.strip().splitlines()[-1], type=_Interpreter)
    except (OSError, subprocess.TimeoutExpired, IndexError, msgspec.MsgspecError):
        raise SetupError(f"--python {given} does not run: give the interpreter of the venv to adopt") from None


@dataclass
class Plan:
    """What the run will do, settled by the cheap checks before anything is installed or deleted."""

    #: The interpreter to adopt (--python), or None to build ``venv``.
    adopt: Union[str, None] = None
    venv: Union[Path, None] = None
    #: Whether ``venv`` is replaced (--force, or a marked folder that is no working venv).
    replace: bool = False
    torch: str = "none"
    upstream: str = ""
    checkout: Union[Path, None] = None
    #: The checkpoints: a directory on disk, or a hub repository to fetch into ``model_dir``.
    model_dir: Path = Path()
    repo_id: Union[str, None] = None
    #: What the run asked for, in words (said when it fails and an older ready record stays).
    wanted: list[str] = field(default_factory=list)


def usable_home() -> Path:
    home = indextts_home()
    problem = home_problem(home)
    if problem is not None:
        raise SetupError(
            f"INDEXTTS_HOME {home} cannot hold the environments: {problem}; point INDEXTTS_HOME at a directory"
        )
    return home


def _free(where: Path) -> int:
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def works(python: Path) -> bool:
    return python.exists() and python_version(str(python)) in SUPPORTED_PYTHONS


def _check_target(venv: Path, home: Path, force: bool) -> bool:
    """Whether the venv folder is replaced; refuses a folder setup did not build (nothing deleted yet)."""
    if venv.is_symlink():
        raise SetupError(f"--venv {venv} is a symlink: give the folder itself")
    if venv.exists() and not venv.is_dir():
        raise SetupError(f"--venv {venv} is a file: give a new or empty folder")
    if not venv.exists() or not any(venv.iterdir()):
        return False
    working = (venv / "pyvenv.cfg").is_file() and works(venv_python(venv))
    if working and not force:
        return False  # kept, repaired in place
    problem = marker_problem(venv, home)
    if problem is not None:
        why = "--force replaces only a venv setup built" if working else "it is not empty and not a working venv"
        raise SetupError(f"refusing to delete {venv}: {problem}, and {why}: remove it yourself or give another --venv")
    return True


def check_checkpoints(model_dir: Path, engine: str) -> None:
    _check_model_dir(model_dir, engine)
    absent = missing(model_dir, engine, aux=False)
    if absent:
        raise SetupError(
            f"{model_dir} lacks {', '.join(absent)}: give a complete IndexTTS-{VERSION_OF[engine]} directory "
            "with --model-dir, or leave it out to download the checkpoints"
        )


def preflight(args: argparse.Namespace, home: Path, uv: Union[str, None], wanted: list[str]) -> Plan:
    """The cheap checks: the interpreter, the venv target, the disk, the checkpoints (or the hub id).

    ``wanted`` gathers what the run asks for as each is settled (said if it fails)."""
    engine: str = args.engine
    plan = Plan(wanted=wanted)
    for constraint in args.constraint:
        if not Path(constraint).is_file():
            raise SetupError(f"--constraint {constraint}: no such file")
    if args.python is not None:
        # Absolute, not resolved: a venv's python is a symlink to its base interpreter.
        python = os.path.abspath(shutil.which(args.python) or args.python)
        plan.wanted.append(f"to adopt {python}")
        version = python_version(python)
        if version is None:
            raise SetupError(f"--python {args.python} does not run: give the interpreter of the venv to adopt")
        if version not in SUPPORTED_PYTHONS:
            raise SetupError(
                f"--python {args.python} is Python {version[0]}.{version[1]} and IndexTTS needs 3.10 or 3.11: "
                "adopt another venv, or leave --python out to build one"
            )
        found = _probe(python, args.python)
        if not (found.venv or found.conda):
            kind = "an externally managed system Python" if found.managed else "not a venv's interpreter"
            raise SetupError(
                f"--python {args.python} is {kind}; setup installs into the venv it adopts: make one "
                f"(`{python} -m venv DIR`) and give DIR/bin/python, or leave --python out to build one"
            )
        if uv is None and not found.pip:
            raise SetupError(
                f"--python {args.python}: that venv has no pip and no uv was found: pip install uv, or add pip there"
            )
        plan.adopt = python
    else:
        plan.venv = Path(args.venv).expanduser().absolute() if args.venv else home / "venvs" / engine
        plan.torch = args.torch if args.torch != "auto" else "cuda" if detect_gpu() else "cpu"
        plan.wanted.append(f"a venv in {plan.venv} from --source {args.source} with torch {plan.torch}")
        plan.replace = _check_target(plan.venv, home, args.force)
        plan.upstream, plan.checkout = upstream_requirement(engine, args.source)
        if uv is None or args.base_python is not None:
            find_base_python(args.base_python)
        if plan.replace or not works(venv_python(plan.venv)):
            needed, free = VENV_BYTES[plan.torch], _free(plan.venv)
            if needed > free:
                raise SetupError(
                    f"the disk under {plan.venv} has {free / 1e9:.1f} GB free and the venv needs about "
                    f"{needed / 1e9:.0f} GB (torch {plan.torch}): free space there, or build it elsewhere (--venv DIR)"
                )
    if args.model_dir is not None:
        plan.model_dir = Path(args.model_dir).expanduser().absolute()
        plan.wanted.append(f"the checkpoints in {plan.model_dir}")
        check_checkpoints(plan.model_dir, engine)
    elif plan.adopt is not None and args.model is None and adopted_checkpoints(plan.adopt) is not None:
        plan.model_dir = adopted_checkpoints(plan.adopt)  # type: ignore[assignment]
        plan.wanted.append(f"the checkpoints beside the venv, {plan.model_dir}")
        check_checkpoints(plan.model_dir, engine)
    else:
        from ._hub import DEFAULT_MODELS, check_model

        plan.repo_id = args.model or DEFAULT_MODELS[engine]
        plan.model_dir = home / "models" / plan.repo_id.replace("/", "--")
        plan.wanted.append(f"the checkpoints of {plan.repo_id} from the hub (no --model-dir)")
        if missing(plan.model_dir, engine, aux=False) or not offline():
            need_hub()
            check_model(plan.repo_id, plan.model_dir)
    if missing(plan.model_dir, engine, aux=True) and offline():
        raise SetupError(
            f"HF_HUB_OFFLINE is set and the auxiliary models are not in {plan.model_dir / 'hf_cache'}: "
            "unset HF_HUB_OFFLINE, or copy a filled hf_cache/ there"
        )
    return plan


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
