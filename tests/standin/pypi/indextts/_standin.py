"""Loads the shared stand-in implementation (tests/standin/_core.py) once per process."""

import importlib.util
import os
import sys

_NAME = "indextts._standin_core"
core = sys.modules.get(_NAME)
if core is None:
    _path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "_core.py")
    _spec = importlib.util.spec_from_file_location(_NAME, os.path.normpath(_path))
    core = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = core
    _spec.loader.exec_module(core)
