"""The registry of engine environments: one JSON record per engine under ``INDEXTTS_HOME``.

``indextts-client setup ENGINE`` writes a record once the environment is verified (``status``
"ready"); a run that fails or is interrupted leaves it "incomplete", which discovery ignores.
:func:`discover` is what ``Client`` (and so ``Pool``, ``BlockingClient``, ``say``, ``serve``,
``wyoming``) and the doctor ask when they are given no interpreter and no ``model_dir``.

Standard library and msgspec only: ``Client`` imports it, and so does ``setup`` (``_setup/``, a
tool above ``Client``), which is why it lives here and not in that folder.  The data directory is
``INDEXTTS_HOME``, else platformdirs' user data directory (the ``cli`` extra), else the same
rule written out for a venv without platformdirs.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Union

import msgspec

__all__ = [
    "HOME_ENV",
    "INDEXTTS_ENGINES",
    "MARKER",
    "SETUP_ENGINES",
    "Discovered",
    "EnvRecord",
    "discover",
    "home_problem",
    "indextts_home",
    "list_records",
    "marker_problem",
    "read_record",
    "record_path",
    "remove_record",
    "setup_command",
    "write_record",
    "write_marker",
]

HOME_ENV = "INDEXTTS_HOME"
APP_NAME = "indextts-sidecar"
#: Engines that run upstream IndexTTS, and so need an environment of their own.
INDEXTTS_ENGINES = ("indextts", "indextts2", "indextts2.5")
#: Engines ``setup`` builds environments for.
SETUP_ENGINES = ("indextts2", "indextts2.5")
READY = "ready"
INCOMPLETE = "incomplete"
#: The file ``setup`` leaves beside ``pyvenv.cfg`` in every venv it builds: the engine, the
#: home and the venv's own path.  Only a folder that carries it is ever deleted.
MARKER = "indextts-sidecar-setup.json"


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


def home_problem(home: Path) -> Union[str, None]:
    """Why ``home`` cannot hold the registry (a file, a symlink loop, a path under a file), or None.

    Walks up from ``home`` to the first thing that exists; nothing is created.
    """
    given = probe = home.absolute()
    while True:
        try:
            mode = os.stat(probe).st_mode
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"{probe} is a symlink loop" if probe == given else f"{probe} runs into a symlink loop"
            if exc.errno == errno.ENOENT and os.path.islink(probe):
                return f"{probe} is a symlink to nothing"
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                return f"{probe} cannot be read ({exc.strerror or exc})"
            if probe.parent == probe:
                return None
            probe = probe.parent
            continue
        if not stat.S_ISDIR(mode):
            return f"{probe} is a file, not a directory" if probe == given else f"it lies under the file {probe}"
        if not os.access(probe, os.W_OK | os.X_OK):
            return f"{probe} is not writable"
        return None


def record_path(engine: str, home: Union[Path, None] = None) -> Path:
    """The record of ``engine``: one of :data:`SETUP_ENGINES`, never a path."""
    if engine not in SETUP_ENGINES:
        raise ValueError(f"no record for {engine!r}: the engines are {', '.join(SETUP_ENGINES)}")
    return (home or indextts_home()) / "envs" / f"{engine}.json"


def record_problem(record: EnvRecord, engine: str) -> Union[str, None]:
    """Why a decoded record cannot be trusted (a hand edit, another version's file), or None."""
    if record.engine != engine:
        return f"it names the engine {record.engine!r}"
    if record.status not in (READY, INCOMPLETE):
        return f"its status {record.status!r} is unknown"
    for name, value in (("python", record.python), ("model_dir", record.model_dir), ("venv", record.venv or "")):
        if "\0" in value or (value and not os.path.isabs(value)):
            return f"its {name} {value!r} is not an absolute path"
    if record.ready and not (record.python and record.model_dir):
        return "it is ready without a python and a model_dir"
    if record.venv and os.path.commonpath([record.venv, record.python or record.venv]) != os.path.normpath(record.venv):
        return f"its python {record.python} is not inside its venv {record.venv}"
    return None


def read_record(engine: str, home: Union[Path, None] = None) -> Union[EnvRecord, None]:
    """The record of ``engine``, or None (none, or unreadable, or invalid: a broken record is no environment)."""
    try:
        data = record_path(engine, home).read_bytes()
    except (OSError, ValueError):
        return None
    try:
        record = msgspec.json.decode(data, type=EnvRecord)
    except msgspec.MsgspecError:
        return None
    return None if record_problem(record, engine) is not None else record


def write_marker(venv: Path, engine: str, home: Path) -> None:
    """Mark ``venv`` as built by setup (see :data:`MARKER`)."""
    data = {"engine": engine, "home": str(home.absolute()), "venv": str(venv.absolute())}
    (venv / MARKER).write_bytes(msgspec.json.encode(data) + b"\n")


def marker_problem(venv: Path, home: Path) -> Union[str, None]:
    """Why ``venv`` may not be deleted, or None when setup built it.

    It must be a real folder (not a symlink) holding ``pyvenv.cfg`` and the marker, and lie
    inside ``home`` or where its marker says setup built it.
    """
    if venv.is_symlink() or not venv.is_dir():
        return f"{venv} is not a folder" if not venv.is_symlink() else f"{venv} is a symlink"
    try:
        marker = msgspec.json.decode((venv / MARKER).read_bytes(), type=dict[str, str])
    except (OSError, msgspec.MsgspecError):
        return f"{venv} carries no setup marker ({MARKER}): setup did not build it"
    if not (venv / "pyvenv.cfg").is_file():
        return f"{venv} is not a venv (no pyvenv.cfg)"
    real = os.path.realpath(venv)
    inside = os.path.commonpath([real, os.path.realpath(home)]) == os.path.realpath(home)
    if not inside and marker.get("venv") != real and marker.get("venv") != str(venv.absolute()):
        return f"{venv}'s setup marker names another folder ({marker.get('venv')}): it was copied, not built there"
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
    """The valid records, in engine order."""
    return [r for r in (read_record(name, home) for name in SETUP_ENGINES) if r is not None]


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
