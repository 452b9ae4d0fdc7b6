"""``indextts-client envs``: list the records, remove one (and the venv, only where setup built it)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any, Union

import msgspec

from .._registry import (
    INDEXTTS_ENGINES,
    SETUP_ENGINES,
    EnvRecord,
    home_problem,
    indextts_home,
    list_records,
    marker_problem,
    read_record,
    record_path,
    record_problem,
    remove_record,
)

__all__ = ["add_envs_parser", "envs_command", "os_error", "registered_for_doctor"]


def add_envs_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    envs = commands.add_parser("envs", help="list the engine environments setup registered", parents=parents)
    envs.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    actions = envs.add_subparsers(dest="envs_action")
    remove = actions.add_parser("remove", help="delete an engine's record (and the venv setup built for it)")
    remove.add_argument("engine", metavar="ENGINE")


# ------------------------------------------------------------------------------------------ progress


def os_error(exc: OSError) -> str:
    where = f" {exc.filename}" if exc.filename else ""
    return f"cannot use{where}: {exc.strerror or exc}"


def envs_command(args: argparse.Namespace) -> int:
    home = indextts_home()
    problem = home_problem(home)
    if problem is not None:
        print(f"indextts-client envs: INDEXTTS_HOME {home} cannot be used: {problem}", file=sys.stderr)
        return 1
    if getattr(args, "envs_action", None) == "remove":
        return _remove(args.engine, home)
    records = list_records()
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(records) + b"\n")
        return 0
    if not records:
        print(f"no environments in {home}: run `indextts-client setup indextts2`")
        return 0
    for r in records:
        where = f"python={r.python} model_dir={r.model_dir} source={r.source}"
        print(f"{r.engine:<12} {r.status:<10} {r.device:<5} {where}")
    return 0


def _remove(engine: str, home: Path) -> int:
    """``envs remove ENGINE``: the record, and the venv only where setup built it (its marker)."""
    if engine not in SETUP_ENGINES:
        print(f"indextts-client envs: ENGINE is one of {', '.join(SETUP_ENGINES)}, not {engine!r}", file=sys.stderr)
        return 2
    path = record_path(engine, home)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        print(f"indextts-client envs: no environment registered for {engine}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"indextts-client envs: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        record: Union[EnvRecord, None] = msgspec.json.decode(data, type=EnvRecord)
        invalid = record_problem(record, engine)  # type: ignore[arg-type]
    except msgspec.MsgspecError as exc:
        record, invalid = None, f"it does not decode ({exc})"
    remove_record(engine, home)
    if record is None or invalid is not None:
        print(
            f"indextts-client envs: removed the record of {engine}, which was not valid ({invalid}); "
            "no folder was deleted",
            file=sys.stderr,
        )
        return 1
    kept = f"; the checkpoints stay in {record.model_dir}" if record.model_dir else ""
    if record.venv:
        venv = Path(record.venv)
        refused = marker_problem(venv, home) if venv.exists() or venv.is_symlink() else None
        if refused is not None:
            print(f"indextts-client envs: removed the record of {engine} but kept {venv}: {refused}", file=sys.stderr)
            return 1
        if venv.exists():
            try:
                shutil.rmtree(venv)
            except OSError as exc:
                print(f"indextts-client envs: removed the record of {engine}; {os_error(exc)}", file=sys.stderr)
                return 1
    print(f"removed {engine}" + (f" and its venv {record.venv}" if record.venv else "") + kept)
    return 0


def registered_for_doctor(engine: Union[str, None]) -> Union[EnvRecord, None]:
    """The record the doctor checks when given no --python: the engine's, or the first ready IndexTTS one."""
    names = (engine,) if engine in SETUP_ENGINES else SETUP_ENGINES if engine in (None, *INDEXTTS_ENGINES) else ()
    for name in names:
        record = read_record(name)
        if record is not None and record.ready:
            return record
    return None
