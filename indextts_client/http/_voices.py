"""``/v1/audio/voices``: every voice a request may name, and uploads into the voice store.

Which voice a request means is the service's (:mod:`indextts_client._service.voices`); here
are the routes: ``GET`` lists every source's voices with where each comes from and its
languages, ``POST`` uploads a clip (refused at once for an engine that cannot clone), and
``DELETE`` removes an uploaded one.  The store's methods block, so they run in a thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from indextts_sidecar.voicestore import VoiceInfo, VoiceStore, VoiceStoreError

from .._service import EngineFacts, Kind, ListedVoice, Refusal, VoiceSources

__all__ = ["VoiceRoutes"]

#: Form fields a voice upload may carry (OpenAI's ``audio_sample``, or ``file``).
_CLIP_FIELDS = ("audio_sample", "file")
#: The store's refusals by class: kind and code.
_STORE_ERRORS = {
    "VoiceInvalid": (Kind.INVALID, "voice_invalid"),
    "VoiceTooLarge": (Kind.TOO_LARGE, "voice_too_large"),
    "VoiceStoreFull": (Kind.TOO_LARGE, "voice_store_full"),
    "VoiceConflict": (Kind.CONFLICT, "voice_conflict"),
    "VoiceNotFound": (Kind.NOT_FOUND, "voice_not_found"),
}
T = TypeVar("T")


def _stored_json(info: VoiceInfo) -> dict[str, object]:
    """OpenAI's voice object (``id``, ``name``, ``created_at``...) and the store's facts of the clip."""
    facts = msgspec.to_builtins(info)
    return {"object": "audio.voice", "type": "audio_sample", "created_at": int(info.created), **facts}


def _listed_json(voice: ListedVoice) -> dict[str, object]:
    if voice.stored is not None:
        return {**_stored_json(voice.stored), "source": voice.source, "languages": list(voice.languages)}
    return {
        "object": "audio.voice",
        "id": voice.name,
        "name": voice.name,
        "source": voice.source,
        "languages": list(voice.languages),
    }


class VoiceRoutes:
    def __init__(self, sources: VoiceSources, facts: Callable[[], EngineFacts]) -> None:
        self.sources, self.facts = sources, facts

    def _require_store(self) -> VoiceStore:
        if self.sources.store is None:
            raise Refusal(Kind.NOT_FOUND, "this server keeps no voices (serve --voice-dir DIR)", code="voices_disabled")
        return self.sources.store

    async def upload(self, request: Request) -> Response:
        store = self._require_store()
        facts = self.facts()
        if not facts.clones:
            raise Refusal(
                Kind.INVALID,
                f"engine {facts.name!r} cannot speak in a voice from a clip: name one of its own voices",
                param="audio_sample",
                code="voice_clone_unsupported",
            )
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise Refusal(
                Kind.UNSUPPORTED_MEDIA,
                "a voice upload is multipart/form-data (the clip and a name)",
                code="bad_content_type",
            )
        async with request.form(max_files=1, max_fields=8) as form:
            name = form.get("name")
            clip = next((form[f] for f in _CLIP_FIELDS if f in form), None)
            if not isinstance(name, str) or not name:
                raise Refusal(Kind.INVALID, "the upload needs a name field", param="name")
            if clip is None or isinstance(clip, str):
                raise Refusal(
                    Kind.INVALID, "the upload needs the clip as a file field audio_sample", param="audio_sample"
                )
            data = await clip.read()
            replace = str(form.get("replace", "")).lower() in ("1", "true", "yes")
        info = await _store_call(lambda: store.add(name, data, replace=replace))
        return JSONResponse(_stored_json(info))

    async def list(self, request: Request) -> Response:
        facts = self.facts()
        voices = await _store_call(lambda: self.sources.listing(facts))
        return JSONResponse({"object": "list", "data": [_listed_json(v) for v in voices]})

    async def delete(self, request: Request) -> Response:
        store = self._require_store()
        voice_id = request.path_params["voice_id"]
        await _store_call(lambda: store.delete(voice_id))
        return JSONResponse({"id": voice_id, "object": "audio.voice.deleted", "deleted": True})


async def _store_call(call: Callable[[], T]) -> T:
    try:
        return await anyio.to_thread.run_sync(call)
    except VoiceStoreError as exc:
        kind, code = _STORE_ERRORS.get(type(exc).__name__, (Kind.INTERNAL, "voice_store_error"))
        param = {"audio": "audio_sample"}.get(exc.field or "", exc.field)
        raise Refusal(kind, exc.message, param=param, code=code) from None
