"""The sidecar side of indextts-sidecar: run a TTS engine in its own process and venv.

Start it as ``python -m indextts_sidecar --engine NAME``; it speaks protocol v1
(``indextts_sidecar.protocol``, ``docs/protocol.md``) on stdin/stdout.  This package
is kept light: importing it imports neither anyio, numpy nor any engine.
"""

from ._version import __version__

__all__ = ["__version__"]
