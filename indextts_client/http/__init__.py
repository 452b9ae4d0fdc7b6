"""An OpenAI-compatible speech endpoint over a :class:`Pool` (extra ``[server]``).

::

    from indextts_client.http import create_app
    app = create_app("espeak", size=2, api_key="...")      # any ASGI server runs it

or from a shell: ``indextts-client serve --engine espeak --size 2`` (uvicorn).
``POST /v1/audio/speech`` takes OpenAI's body and answers ``mp3`` (the default),
``opus``, ``aac``, ``flac``, ``wav`` or ``pcm``; ``/v1/audio/voices`` uploads, lists and
deletes voices; ``GET /v1/models``, ``/health``, ``/metrics``.  docs/serving.md has it all.

HTTP only: what a request means (voices, emotion, speed, options, failures) is the service
core's (:mod:`indextts_client._service`); these modules adapt it.  :mod:`._schema` (the
request body), :mod:`._encoders`, :mod:`._voices` (the voice routes), :mod:`._limits`
(bounds, deadlines), :mod:`._origins` (Origin, Host, CORS), :mod:`._speech` (the speech
route), :mod:`._ws_events` and :mod:`._websocket` (the WebSocket route), :mod:`._errors`
(a refusal as OpenAI's error JSON), :mod:`._app` (them together), :mod:`._serve` (the
command), :mod:`._timing` (timing headers and latency histograms), :mod:`._metrics` (``/metrics``),
:mod:`._alignment` (word timings as both routes' events), :mod:`._playground` (the page at ``/``).
"""

from __future__ import annotations

try:
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        f'indextts_client.http needs the [server] extra ({exc}): from the clone, pip install -e ".[server]"'
    ) from exc

from .._service import FORMATS, OPENAI_VOICES
from ._app import create_app
from ._limits import Limits
from ._schema import SpeechRequest
from ._serve import main

__all__ = ["FORMATS", "OPENAI_VOICES", "Limits", "SpeechRequest", "create_app", "main"]
