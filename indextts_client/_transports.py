"""How a client reaches its sidecar: the command line and environment of a spawned one."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Union

import msgspec

__all__ = ["child_environment", "sidecar_command"]


def sidecar_command(
    engine: Union[str, None],
    engine_options: Union[Mapping[str, Any], None],
    *,
    python: Union[str, os.PathLike[str], None],
    command: Union[Sequence[Union[str, os.PathLike[str]]], None],
    sidecar_args: Sequence[str],
) -> list[str]:
    """The command line of a spawned sidecar: the prefix, ``--engine``, ``-o key=<json>``, the extra arguments."""
    if command is not None and python is not None:
        raise ValueError("give python or command, not both")
    if command is not None:
        argv = [os.fspath(part) for part in command]
    else:
        argv = [os.fspath(python) if python is not None else sys.executable, "-m", "indextts_sidecar"]
    if engine is not None:
        argv += ["--engine", engine]
    for key, value in (engine_options or {}).items():
        argv += ["-o", f"{key}={msgspec.json.encode(value).decode()}"]
    argv += list(sidecar_args)
    return argv


def child_environment(env: Union[Mapping[str, str], None], *, inherit_env: bool) -> dict[str, str]:
    """The spawned sidecar's environment: this process's (unless not inherited) updated with ``env``."""
    child_env = dict(os.environ) if inherit_env else {}
    child_env.update(env or {})
    return child_env
