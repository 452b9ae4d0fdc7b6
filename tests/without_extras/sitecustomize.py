"""Python as it is in a venv without some packages: put this folder on ``PYTHONPATH`` and name
the packages' top-level modules, comma-separated, in ``INDEXTTS_TEST_WITHOUT``.

The interpreter's path finder then finds none of them: ``import`` raises ``ModuleNotFoundError``
("No module named ...") and ``importlib.util.find_spec`` answers None, as where they were never
installed.  Children inherit both variables, so a sidecar that ``serve`` spawns lacks them too.
Used where a test needs one module gone from its own venv (espeak, for the examples' failure
paths: tests/test_examples.py, tests/agents/); tests/serving/test_start_checks.py uses real
venvs of the documented extras instead (tests/upstream/build_venv.py).
"""

from __future__ import annotations

import importlib.machinery
import os
from typing import Any

_WITHOUT = frozenset(filter(None, os.environ.get("INDEXTTS_TEST_WITHOUT", "").split(",")))

if _WITHOUT:
    _find_spec = importlib.machinery.PathFinder.find_spec

    def _find_spec_without(fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.partition(".")[0] in _WITHOUT:
            return None
        return _find_spec(fullname, path, target)

    importlib.machinery.PathFinder.find_spec = staticmethod(_find_spec_without)  # type: ignore[method-assign,assignment]
