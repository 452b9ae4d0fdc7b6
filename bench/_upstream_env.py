"""Where the bench scripts that drive the real upstream find it: its venv's python, its checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Union

ROOT = Path(__file__).resolve().parent.parent


def upstream_env() -> Union[tuple[str, str], None]:
    """(``INDEXTTS_UPSTREAM_PYTHON``, the GitHub checkout), or None after saying what is missing."""
    python = os.environ.get("INDEXTTS_UPSTREAM_PYTHON")
    if not python:
        print("set INDEXTTS_UPSTREAM_PYTHON (python3 tests/upstream/build_venv.py github prints it)", file=sys.stderr)
        return None
    return python, os.environ.get("INDEXTTS_UPSTREAM_SRC") or str(ROOT.parent / "shared" / "upstream" / "index-tts")
