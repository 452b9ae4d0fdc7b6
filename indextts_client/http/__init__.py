"""An OpenAI-compatible speech endpoint over a :class:`Pool` (extra ``[server]``).

::

    from indextts_client.http import create_app
    app = create_app("espeak", size=2, api_key="...")      # any ASGI server runs it

or from a shell: ``indextts-client serve --engine espeak --size 2`` (uvicorn).
``POST /v1/audio/speech`` takes OpenAI's body and answers ``mp3`` (the default),
``opus``, ``aac``, ``flac``, ``wav`` or ``pcm``; ``/v1/audio/voices`` uploads, lists and
deletes voices; ``GET /v1/models``, ``/health``, ``/metrics``.  docs/serving.md has it all.

The parts, each usable alone: :mod:`._schema` (the request struct), :mod:`._encoders`,
:mod:`._voices` (voice resolution and uploads), :mod:`._backends` (Pool, Ray),
:mod:`._limits` (bounds), :mod:`._speech` (the speech route), :mod:`._errors`
(OpenAI's error JSON), :mod:`._app` (them together), :mod:`._serve` (the command),
:mod:`._emotion` (``instructions`` and the emotion fields), :mod:`._timing` (timing headers
and latency histograms), :mod:`._playground` (the page at ``/``).
"""

from __future__ import annotations

try:
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "indextts_client.http needs the [server] extra: "
        f"pip install starlette uvicorn prometheus-client av python-multipart websockets ({exc})"
    ) from exc

from ._app import create_app
from ._limits import Limits
from ._schema import FORMATS, SpeechRequest
from ._serve import main
from ._voices import OPENAI_VOICES

__all__ = ["FORMATS", "OPENAI_VOICES", "Limits", "SpeechRequest", "create_app", "main"]
