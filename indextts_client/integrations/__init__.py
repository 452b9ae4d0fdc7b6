"""Voice-agent frameworks' native services for IndexTTS, each behind an extra of its own.

- :mod:`indextts_client.integrations.pipecat` (extra ``pipecat``): Pipecat TTS services, over
  ``serve``'s WebSocket route or a Client/Pool in process.
- :mod:`indextts_client.integrations.livekit` (extra ``livekit``): a LiveKit Agents ``tts.TTS``
  over ``serve``'s WebSocket route.
- ``_socket``: what both share of the route, framework-free (its events, a turn's word timeline).

Importing this package imports no framework; each module imports its own.  docs/agents.md.
"""
