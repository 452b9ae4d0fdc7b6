"""The registry of engine environments: one JSON record per engine under ``INDEXTTS_HOME``.

``indextts-client setup ENGINE`` writes a record once the environment is verified (``status``
"ready"); a run that fails or is interrupted leaves it "incomplete", which discovery ignores.
:func:`discover` is what ``Client`` (and so ``Pool``, ``BlockingClient``, ``say``, ``serve``,
``wyoming``) and the doctor ask when they are given no interpreter and no ``model_dir``.

Standard library and msgspec only: ``Client`` imports it.  The data directory is
``INDEXTTS_HOME``, else platformdirs' user data directory (the ``cli`` extra), else the same
rule written out for a venv without platformdirs.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Union

import msgspec

__all__ = [
    "HOME_ENV",
    "INDEXTTS_ENGINES",
    "SETUP_ENGINES",
    "Discovered",
    "EnvRecord",
    "discover",
    "indextts_home",
    "list_records",
    "read_record",
    "record_path",
    "remove_record",
    "setup_command",
    "write_record",
]

HOME_ENV = "INDEXTTS_HOME"
APP_NAME = "indextts-sidecar"
#: Engines that run upstream IndexTTS, and so need an environment of their own.
INDEXTTS_ENGINES = ("indextts", "indextts2", "indextts2.5")
#: Engines ``setup`` builds environments for.
SETUP_ENGINES = ("indextts2", "indextts2.5")
READY = "ready"
INCOMPLETE = "incomplete"


class EnvRecord(msgspec.Struct, kw_only=True):
    """One engine's environment, as ``setup`` left it."""

    engine: str
    #: The interpreter of the engine's venv.
    python: str
    #: The checkpoint directory (auxiliary models in its ``hf_cache/``).
    model_dir: str
    #: "ready" once verified (or set up with ``--no-verify``); "incomplete" otherwise.
    status: str = INCOMPLETE
    #: Where upstream's code came from: "github@<commit>", "pypi:<distribution>", or a checkout's path;
    #: "adopted" for a venv given with ``--python``.
    source: str = ""
    #: The hub repository the checkpoints came from; None for ``--model-dir``.
    model: Union[str, None] = None
    #: "cuda", "mps" or "cpu": where the verification ran (or would run).
    device: str = "cpu"
    #: Engine options every client of this environment starts with (given ones win), e.g.
    #: ``use_qwen_emo: false`` for a checkpoint directory without the Qwen emotion model.
    engine_options: dict[str, Any] = msgspec.field(default_factory=dict)
    #: The venv ``setup`` built (removed with the record); None for an adopted one.
    venv: Union[str, None] = None
    #: Versions found in the venv: indextts-sidecar, torch, transformers, indextts.
    versions: dict[str, Union[str, None]] = msgspec.field(default_factory=dict)
    #: Whether the last run verified it (doctor and one synthesis).
    verified: bool = False
    #: Why the last run stopped, when it did.
    error: Union[str, None] = None
    #: Seconds since the epoch of the last change.
    updated: float = 0.0

    @property
    def ready(self) -> bool:
        return self.status == READY


def _default_home() -> Path:
    try:
        import platformdirs
    except ImportError:  # the cli extra is absent: platformdirs' rule, written out
        if sys.platform == "darwin":
            return Path.home() / "Library" / "Application Support" / APP_NAME
        if sys.platform == "win32":
            base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
            return Path(base) / APP_NAME
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / APP_NAME
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def indextts_home() -> Path:
    """The data directory: ``INDEXTTS_HOME``, else the platform's user data directory."""
    explicit = os.environ.get(HOME_ENV)
    return Path(explicit).expanduser() if explicit else _default_home()


def record_path(engine: str, home: Union[Path, None] = None) -> Path:
    return (home or indextts_home()) / "envs" / f"{engine}.json"


def read_record(engine: str, home: Union[Path, None] = None) -> Union[EnvRecord, None]:
    """The record of ``engine``, or None (none, or unreadable: a broken record is no environment)."""
    try:
        data = record_path(engine, home).read_bytes()
    except OSError:
        return None
    try:
        return msgspec.json.decode(data, type=EnvRecord)
    except msgspec.MsgspecError:
        return None


def write_record(record: EnvRecord, home: Union[Path, None] = None) -> Path:
    """Write ``record`` atomically (a reader sees the old one or the new one, never half)."""
    import time

    record.updated = time.time()
    path = record_path(record.engine, home)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(msgspec.json.format(msgspec.json.encode(record)) + b"\n")
    os.replace(temporary, path)
    return path


def remove_record(engine: str, home: Union[Path, None] = None) -> bool:
    try:
        record_path(engine, home).unlink()
    except FileNotFoundError:
        return False
    return True


def list_records(home: Union[Path, None] = None) -> list[EnvRecord]:
    folder = (home or indextts_home()) / "envs"
    try:
        names = sorted(p.stem for p in folder.glob("*.json"))
    except OSError:
        return []
    return [r for r in (read_record(name, home) for name in names) if r is not None]


def setup_command(engine: str) -> str:
    """The command that sets ``engine`` up (``indextts`` means IndexTTS-2)."""
    return f"indextts-client setup {engine if engine in SETUP_ENGINES else 'indextts2'}"


class Discovered(NamedTuple):
    """What to spawn: the interpreter, the engine options, environment additions; or why nothing can be."""

    python: Union[str, os.PathLike[str], None]
    engine_options: Union[Mapping[str, Any], None]
    env: dict[str, str]
    #: Set when the engine needs an environment and none is registered: the message to raise.
    missing: Union[str, None] = None


def discover(
    engine: Union[str, None],
    *,
    python: Union[str, os.PathLike[str], None],
    command: Union[object, None],
    engine_options: Union[Mapping[str, Any], None],
) -> Discovered:
    """The registered environment of an IndexTTS ``engine`` when the caller named none.

    Explicit arguments win: a ``python``, a ``command`` or a ``model_dir`` engine option leave
    everything as given, and so does any other engine (``fake``, ``espeak``: this interpreter).
    With no ready record, an interpreter that has upstream's package itself still runs the
    engine in place (as before the registry existed); otherwise ``missing`` holds the message
    naming the exact ``setup`` command.
    """
    unchanged = Discovered(python, engine_options, {})
    if engine not in INDEXTTS_ENGINES or python is not None or command is not None:
        return unchanged
    if engine_options and "model_dir" in engine_options:
        return unchanged
    candidates = (engine,) if engine in SETUP_ENGINES else SETUP_ENGINES
    for name in candidates:
        record = read_record(name)
        if record is not None and record.ready:
            options = {"model_dir": record.model_dir, **record.engine_options, **(engine_options or {})}
            # The checkpoints and the auxiliary models are on disk: nothing is fetched at load.
            return Discovered(record.python, options, {"HF_HUB_OFFLINE": "1"})
    if importlib.util.find_spec("indextts") is not None or importlib.util.find_spec("indextts25") is not None:
        return unchanged
    where = indextts_home()
    return Discovered(
        python,
        engine_options,
        {},
        missing=(
            f"no environment is set up for {engine} (registry: {where}): run `{setup_command(engine)}`, "
            "or pass python= (--python) the interpreter of a venv that has IndexTTS"
        ),
    )
