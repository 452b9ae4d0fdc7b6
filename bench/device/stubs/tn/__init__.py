"""Stand-in for WeTextProcessing's ``tn`` on the GPU machine (bench/gpu_run.sh only, never installed).

Upstream's text front end (indextts/utils/front.py) takes ``tn`` (WeTextProcessing, which needs
pynini: a 165 MB wheel, over what one device call can carry) on Linux, and ``wetext`` (the same
grammars, compiled, run by kaldifst: 6.5 MB) on macOS and Windows.  These modules give the
Linux import path wetext's normalizers, built with the arguments upstream's own macOS and
Windows branch passes, so the GPU run normalizes text as upstream does there.
"""
