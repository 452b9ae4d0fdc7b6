"""The IndexTTS-2.5 checkout still ships ``infer_v2``: the same stand-in as ../../v2/indextts/infer_v2.py."""

import os

_source = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "v2", "indextts", "infer_v2.py")
with open(_source, encoding="utf-8") as _f:
    exec(compile(_f.read(), os.path.normpath(_source), "exec"))
