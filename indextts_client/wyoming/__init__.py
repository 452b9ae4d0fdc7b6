"""A Wyoming server (Home Assistant's voice protocol) over the speech service (extra ``[wyoming]``).

::

    indextts-client wyoming --uri tcp://0.0.0.0:10200 --engine indextts2 --python ENGINE_PYTHON \\
        -O model_dir=/models/IndexTTS-2 --voice alice=/voices/alice.wav --voice-dir /voices

A thin adapter over :mod:`indextts_client._service`: a request's voice is resolved and prepared
there (:func:`~indextts_client._service.prepare`), and every refusal or failure is rendered as
an ``error`` event with the service's code and message.  Per connection:

* ``describe`` -> ``info``: one TTS program whose voices are those a request may name (the
  ``--voice`` names, the clips of ``--voice-dir``, uploaded voices, the engine's own voices),
  each with its languages, streaming supported;
* ``synthesize`` (the whole text) -> ``audio-start``, ``audio-chunk``..., ``audio-stop``;
* ``synthesize-start``, ``synthesize-chunk``..., ``synthesize-stop`` -> per sentence, as soon as
  it is complete, one ``audio-start``/``audio-chunk``.../``audio-stop`` cycle, then
  ``synthesize-stopped``.  A ``synthesize`` during a streamed request (Home Assistant sends
  both, for servers that do not stream) is ignored.

The listening socket is our own (``tcp://HOST:PORT`` or ``unix://PATH``), the events are
read and written by the wyoming package's framing under our bounds (:class:`Limits`): a
malformed or too deeply nested event is answered with an ``error`` event and the connection
goes on; a client that stops reading loses its socket at once when its write times out
(aborted, never a close that waits to flush).  The wyoming package runs on asyncio only, so
this server does too.
"""

from __future__ import annotations

from ._handler import DEFAULT_LANGUAGES, DEFAULT_VOICE_NAME, Handler, Limits, WyomingService
from ._server import main, serve

__all__ = ["DEFAULT_LANGUAGES", "DEFAULT_VOICE_NAME", "Handler", "Limits", "WyomingService", "main", "serve"]
