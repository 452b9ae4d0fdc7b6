"""The speech-service core under every front end (HTTP, the WebSocket route, Wyoming).

It imports no Starlette, no uvicorn and no wyoming: a front end turns its wire format into
these values and renders what comes back.  The path of a request::

    fields (SpeechFields, decoded by the front end; check_depth on the raw text first)
      -> SpeechSettings.merged(fields)        the front end's defaults, then what was given
      -> prepare(settings, backend.facts, sources, max_input=..., max_silence=...)  -> Prepared
      -> backend.stream(text, prepared)       -> ServedStream (AudioChunk; timings, facts, member_index)
         backend.stream_text(texts, prepared) -> TextStream
    any failure: Refusal (raised by prepare, the sources...), or a SidecarError -> refusal_of(exc)

The API:

- :mod:`.refusal`: ``Refusal(kind, message, param=, code=)`` with ``Kind`` (INVALID, BUSY,
  UNAVAILABLE...), ``refusal_of(SidecarError) -> Refusal`` (the one failure table),
  ``without_paths(text)``.  Front ends only render a refusal (HTTP: status + OpenAI JSON;
  WebSocket and Wyoming: an ``error`` event with ``code`` and ``message``).
- :mod:`.fields`: ``SpeechFields`` (msgspec struct of the shared request fields with their
  bounds, ``UNSET`` where not given: voice, response_format, speed, sample_rate, options,
  instructions, emotion, emotion_reference, emotion_strength), ``SpeechSettings`` (resolved),
  the bounded types ``Speed``, ``SampleRate``, ``Strength``, ``FORMATS``.
- :mod:`.prepare`: ``prepare()`` (voice, emotion, speed and options, sample rate, in that
  order) -> ``Prepared(voice, emotion, sample_rate, options, response_format, voice_source,
  text_format, max_silence)`` (an SSML request's breaks bounded by the server's ``--max-silence``);
  ``check_text(name, text, max_input)``; ``PCM_RATE``.  Engine options stay a mapping.
- :mod:`.voices`: ``VoiceSources(mapping, directory, limits)``; ``resolve(name, facts)`` ->
  ``Resolved(value, source)`` over the sources mapped, clip, uploaded, engine, openai (in that
  order); ``listing(facts)`` -> ``ListedVoice(name, source, languages)``; ``parse_voice_map``.
- :mod:`.facts`: ``EngineFacts(name, capabilities, speed, voices)`` from the sidecar's ``ready``
  and ``voices`` (``clones``: whether it speaks a voice from a clip), ``EngineVoice``.
- :mod:`.backend`: the ``Backend`` protocol (``facts``, ``start``, ``aclose``, ``stream``,
  ``stream_text``, ``health() -> HealthReport``), ``ServedStream``, ``PoolBackend``, ``RayBackend``.
- :mod:`.depth`: ``check_depth(raw, limit=MAX_DEPTH)``: nesting refused (``too_deep``) before decoding.
- :mod:`.settings`: ``add_voice_arguments(parser)``, ``add_ssml_arguments(group)``
  (``check_max_silence(seconds)``: its bounds, for a front end's own limits) and
  ``ServeSettings.from_args(args, parser)``: the serving flags (pool, voices, ``--max-silence``)
  once, frozen; ``positive(int)`` for bounds flags.

For Wyoming: build ``PoolBackend(Pool(settings.engine, **settings.pool))`` and
``settings.sources()``; after ``backend.start()``, ``backend.facts`` has the engine's voices
with their languages (``sources.listing(facts)`` for ``info``); ``check_depth(line)`` before
decoding an event; a synthesize event's fields become ``SpeechSettings(voice=...)``, then
``prepare()``; render ``Refusal.code``/``.message`` (``refusal_of(exc)`` for a SidecarError)
as the ``error`` event.
"""

from __future__ import annotations

from .backend import (
    Backend,
    HealthReport,
    MemberReport,
    PoolBackend,
    RayBackend,
    RayLike,
    ReplicaInfo,
    ReplicaPing,
    ServedStream,
)
from .depth import MAX_DEPTH, check_depth, depth_of
from .facts import EngineFacts, EngineVoice
from .fields import FORMATS, SampleRate, SpeechFields, SpeechSettings, Speed, Strength, VoiceRef
from .prepare import PCM_RATE, Prepared, check_text, engine_options, prepare, speed_options
from .refusal import Kind, Refusal, refusal_of, without_paths
from .settings import (
    MAX_SILENCE_BOUND,
    ServeSettings,
    add_ssml_arguments,
    add_voice_arguments,
    check_max_silence,
    positive,
)
from .voices import OPENAI_VOICES, ListedVoice, Resolved, VoiceSources, parse_voice_map, unknown_voice

__all__ = [
    "FORMATS",
    "MAX_DEPTH",
    "MAX_SILENCE_BOUND",
    "OPENAI_VOICES",
    "PCM_RATE",
    "Backend",
    "EngineFacts",
    "EngineVoice",
    "HealthReport",
    "Kind",
    "ListedVoice",
    "MemberReport",
    "PoolBackend",
    "Prepared",
    "RayBackend",
    "RayLike",
    "Refusal",
    "ReplicaInfo",
    "ReplicaPing",
    "Resolved",
    "SampleRate",
    "ServeSettings",
    "ServedStream",
    "Speed",
    "SpeechFields",
    "SpeechSettings",
    "Strength",
    "VoiceRef",
    "VoiceSources",
    "add_ssml_arguments",
    "add_voice_arguments",
    "check_depth",
    "check_max_silence",
    "check_text",
    "depth_of",
    "engine_options",
    "parse_voice_map",
    "positive",
    "prepare",
    "refusal_of",
    "speed_options",
    "unknown_voice",
    "without_paths",
]
