"""Which voice a request means, and ``/v1/audio/voices``: uploads into the voice store.

A request's ``voice`` is, in this order: a name from the ``voices`` map (``--voice``), a
clip file directly inside the voice directory (``alice.wav``, or ``alice`` for it), an
uploaded voice's id or name, or one of OpenAI's voice names (the engine's default voice).
Anything else is one 400 whose text does not depend on what exists on the server.

The store is :mod:`indextts_sidecar.voicestore`, the same one the sidecar's
``register_voice`` uses, with the same bounds; its methods block, so they run in a thread.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from typing import Any, Union

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ._errors import HTTPError

__all__ = ["OPENAI_VOICES", "Voices"]

#: OpenAI's voice names; where the map has no entry they mean the engine's default voice.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar"}
)
_CLIP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".m4a", ".webm")
#: Form fields a voice upload may carry (OpenAI's ``audio_sample``, or ``file``).
_CLIP_FIELDS = ("audio_sample", "file")


def _voice_json(info: Any) -> dict[str, Any]:
    """OpenAI's voice object (``id``, ``name``, ``created_at``...) and the store's facts of the clip."""
    facts = msgspec.to_builtins(info)
    return {"object": "audio.voice", "type": "audio_sample", "created_at": int(info.created), **facts}


def _unknown(name: str) -> HTTPError:
    return HTTPError(
        400,
        f"unknown voice {name[:64]!r}: give a --voice name, a clip of the voice directory, an uploaded "
        "voice's id or name, or an OpenAI voice name",
        param="voice",
        code="unknown_voice",
    )


class Voices:
    def __init__(
        self,
        mapping: Union[Mapping[str, Union[str, None]], None],
        directory: Union[str, None],
        limits: Any = None,
    ) -> None:
        self.mapping = dict(mapping or {})
        self.directory = os.path.realpath(directory) if directory else None
        self.store: Any = None
        if self.directory is not None:
            if not os.path.isdir(self.directory):
                raise ValueError(f"the voice directory {directory!r} is not a directory")
            from indextts_sidecar.voicestore import SIDECAR_SUBDIR, VoiceLimits, VoiceStore

            # Where a sidecar given the same --voice-dir keeps its register_voice store: one store.
            store_dir = os.path.join(self.directory, SIDECAR_SUBDIR)
            self.store = VoiceStore(store_dir, limits if limits is not None else VoiceLimits())

    def _clip(self, name: str) -> Union[str, None]:
        """The clip file ``name`` names directly inside the directory, never outside it."""
        if self.directory is None or not _CLIP_NAME.fullmatch(name) or ".." in name:
            return None
        # Only audio files: ``alice.wav``, or ``alice`` for it; never the store's index.
        candidates = [name] if name.lower().endswith(_SUFFIXES) else [name + suffix for suffix in _SUFFIXES]
        for candidate in candidates:
            path = os.path.join(self.directory, candidate)
            try:
                info = os.stat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and os.path.dirname(os.path.realpath(path)) == self.directory:
                return path
        return None

    def _lookup(self, name: str) -> Union[str, None]:
        from indextts_sidecar.voicestore import VoiceStoreError

        path = self._clip(name)
        if path is None and self.store is not None:
            try:
                path = str(self.store.path(name))
            except VoiceStoreError:
                path = None
        return path

    async def resolve(self, name: Union[str, None]) -> Union[str, None]:
        """What the sidecar gets as ``voice`` for a request's ``voice``; 400 when it is none of the above."""
        if name is None:
            return None
        if name in self.mapping:
            return self.mapping[name]
        if self.directory is not None:
            path = await anyio.to_thread.run_sync(self._lookup, name)
            if path is not None:
                return path
        if name in OPENAI_VOICES:
            return None
        raise _unknown(name)

    # ---------------------------------------------------------------- the routes

    def _require_store(self) -> Any:
        if self.store is None:
            raise HTTPError(404, "this server keeps no voices (serve --voice-dir DIR)", code="voices_disabled")
        return self.store

    async def upload(self, request: Request) -> Response:
        store = self._require_store()
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise HTTPError(415, "a voice upload is multipart/form-data (the clip and a name)", code="bad_content_type")
        async with request.form(max_files=1, max_fields=8) as form:
            name = form.get("name")
            clip = next((form[f] for f in _CLIP_FIELDS if f in form), None)
            if not isinstance(name, str) or not name:
                raise HTTPError(400, "the upload needs a name field", param="name")
            if clip is None or isinstance(clip, str):
                raise HTTPError(400, "the upload needs the clip as a file field audio_sample", param="audio_sample")
            data = await clip.read()
            replace = str(form.get("replace", "")).lower() in ("1", "true", "yes")
        info = await self._store_call(store.add, name, data, replace=replace)
        return JSONResponse(_voice_json(info))

    async def list(self, request: Request) -> Response:
        voices = await self._store_call(self._require_store().list)
        return JSONResponse({"object": "list", "data": [_voice_json(v) for v in voices]})

    async def delete(self, request: Request) -> Response:
        voice_id = request.path_params["voice_id"]
        await self._store_call(self._require_store().delete, voice_id)
        return JSONResponse({"id": voice_id, "object": "audio.voice.deleted", "deleted": True})

    async def _store_call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        from indextts_sidecar.voicestore import VoiceStoreError

        try:
            return await anyio.to_thread.run_sync(lambda: method(*args, **kwargs))
        except VoiceStoreError as exc:
            code = re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()  # VoiceTooLarge -> voice_too_large
            param = {"audio": "audio_sample"}.get(exc.field or "", exc.field)
            raise HTTPError(exc.status, exc.message, param=param, code=code) from None
