"""The engines a venv has: ``PYTHON -m indextts_sidecar --describe-engines``, decoded."""

from __future__ import annotations

import subprocess
import sys
from typing import Union

import anyio
import msgspec

from indextts_sidecar.protocol.engine_info import EngineDescription

__all__ = ["EngineDescription", "list_engines"]


async def list_engines(python: Union[str, None] = None, *, time_limit: float = 60.0) -> list[EngineDescription]:
    """Each engine the interpreter ``python`` (default: this one) knows, and whether it can run there.

    Raises ``RuntimeError`` with one line saying why when the listing cannot be had.
    """
    python = python or sys.executable
    command = [python, "-m", "indextts_sidecar", "--describe-engines"]
    try:
        with anyio.fail_after(time_limit):
            result = await anyio.run_process(command, stdin=subprocess.DEVNULL, check=False)
    except TimeoutError:
        raise RuntimeError(f"listing the engines of {python} took over {time_limit:g} s") from None
    except OSError as exc:
        raise RuntimeError(f"cannot run {python}: {exc}") from None
    stderr = (result.stderr or b"").decode("utf-8", "replace").strip()
    if result.returncode != 0:
        last = stderr.splitlines()[-1] if stderr else "(no stderr)"
        if "No module named indextts_sidecar" in stderr:
            last = f"indextts-sidecar is not installed there: {python} -m pip install -e PATH_OF_A_CLONE"
        elif "unrecognized arguments: --describe-engines" in stderr:
            last = f"indextts-sidecar there is too old: {python} -m pip install -e PATH_OF_AN_UP_TO_DATE_CLONE"
        raise RuntimeError(f"{python} could not list its engines (exit {result.returncode}): {last}")
    try:
        return msgspec.json.decode(result.stdout.strip().splitlines()[-1], type=list[EngineDescription])
    except (msgspec.MsgspecError, IndexError) as exc:
        raise RuntimeError(f"{python} printed no engine list that decodes: {exc}") from None
