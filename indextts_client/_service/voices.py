"""Which voice a request means, and the voices a server can list.

A request's ``voice`` is looked up in these sources, in this order:

1. ``mapped``: a name of the ``voices`` map (``--voice NAME=VALUE``); its value goes to the sidecar;
2. ``clip``: a clip file directly inside the voice directory (``alice.wav``, or ``alice`` for it);
3. ``uploaded``: an uploaded voice's id or name (the voice store under the directory);
4. ``engine``: one of the engine's own voices (espeak's ``en-gb``), by name, identifier or language;
5. ``openai``: one of OpenAI's voice names, where nothing above has it: the engine's default voice.

Anything else is one refusal whose text does not depend on what exists on the server.
The store is :mod:`indextts_sidecar.voicestore`, the one the sidecar's ``register_voice``
uses; its methods block, so callers run them in a thread (:func:`anyio.to_thread.run_sync`).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Union

import anyio

from indextts_sidecar.voicestore import SIDECAR_SUBDIR, VoiceInfo, VoiceLimits, VoiceStore, VoiceStoreError

from .facts import EngineFacts
from .refusal import Kind, Refusal

__all__ = ["OPENAI_VOICES", "ListedVoice", "Resolved", "Source", "VoiceSources", "parse_voice_map"]

#: OpenAI's voice names; where nothing else names them they mean the engine's default voice.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar"}
)
_CLIP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".m4a", ".webm")

Source = Literal["mapped", "clip", "uploaded", "engine", "openai"]


@dataclass(frozen=True)
class Resolved:
    """What the sidecar gets as ``voice`` (None: the engine's default), and where it was found."""

    value: Union[str, None]
    source: Source

    @property
    def is_clip(self) -> bool:
        """A clip to clone from: only an engine that clones can speak it."""
        return self.source in ("clip", "uploaded")


@dataclass(frozen=True)
class ListedVoice:
    """One voice a client may name, with where it comes from and its languages (empty: unknown)."""

    name: str
    source: Source
    languages: tuple[str, ...] = ()
    #: The uploaded voice's store facts (id, created...), for OpenAI's voice object.
    stored: Union[VoiceInfo, None] = None


def parse_voice_map(items: list[str]) -> dict[str, Union[str, None]]:
    """``--voice NAME=VALUE`` flags as the map (an empty VALUE: the engine's default voice);
    ValueError names the item that is not ``NAME=VALUE``."""
    voices: dict[str, Union[str, None]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--voice {item!r} is not NAME=VALUE")
        voices[name] = value or None
    return voices


def unknown_voice(name: str, param: str = "voice") -> Refusal:
    shown = "<path>" if "/" in name or "\\" in name else name[:64]  # a path is never echoed
    which = "voice" if param == "voice" else f"{param} voice"
    return Refusal(
        Kind.INVALID,
        f"unknown {which} {shown!r}: give a --voice name, a clip of the voice directory, an uploaded "
        "voice's id or name, one of the engine's voices, or an OpenAI voice name",
        param=param,
        code="unknown_voice",
    )


class VoiceSources:
    """The sources above; ``directory`` None: no clips and no uploads."""

    def __init__(
        self,
        mapping: Union[Mapping[str, Union[str, None]], None] = None,
        directory: Union[str, None] = None,
        limits: Union[VoiceLimits, None] = None,
    ) -> None:
        self.mapping = dict(mapping or {})
        self.directory = os.path.realpath(directory) if directory else None
        self.store: Union[VoiceStore, None] = None
        if self.directory is not None:
            if not os.path.isdir(self.directory):
                raise ValueError(f"the voice directory {directory!r} is not a directory")
            # Where a sidecar given the same --voice-dir keeps its register_voice store: one store.
            store_dir = os.path.join(self.directory, SIDECAR_SUBDIR)
            self.store = VoiceStore(store_dir, limits if limits is not None else VoiceLimits())

    # ---------------------------------------------------------------- resolving (blocking parts)

    def clip(self, name: str) -> Union[str, None]:
        """The clip file ``name`` names directly inside the directory, never outside it."""
        if self.directory is None or not _CLIP_NAME.fullmatch(name) or ".." in name:
            return None
        # Only audio files: ``alice.wav``, or ``alice`` for it; never the store's index.
        candidates = [name] if name.lower().endswith(SUFFIXES) else [name + suffix for suffix in SUFFIXES]
        for candidate in candidates:
            path = os.path.join(self.directory, candidate)
            try:
                info = os.stat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and os.path.dirname(os.path.realpath(path)) == self.directory:
                return path
        return None

    def uploaded(self, name: str) -> Union[str, None]:
        if self.store is None:
            return None
        try:
            return str(self.store.path(name))
        except VoiceStoreError:
            return None

    def _on_disk(self, name: str) -> Union[Resolved, None]:
        path = self.clip(name)
        if path is not None:
            return Resolved(path, "clip")
        path = self.uploaded(name)
        return None if path is None else Resolved(path, "uploaded")

    async def resolve(self, name: Union[str, None], facts: EngineFacts, param: str = "voice") -> Resolved:
        """Where ``name`` is found, in the order above; a :class:`Refusal` when nowhere."""
        if name is None:
            return Resolved(None, "openai")
        if name in self.mapping:
            value = self.mapping[name]  # an engine voice's name is spoken as the engine takes it
            return Resolved(value and (facts.spoken(value) or value), "mapped")
        if self.directory is not None:
            found = await anyio.to_thread.run_sync(self._on_disk, name)
            if found is not None:
                return found
        spoken = facts.spoken(name)
        if spoken is not None:
            return Resolved(spoken, "engine")
        if name in OPENAI_VOICES:
            return Resolved(None, "openai")
        raise unknown_voice(name, param)

    # ---------------------------------------------------------------- listing (blocking)

    def clips(self) -> list[str]:
        """The names of the directory's clips (``alice`` for ``alice.wav``)."""
        if self.directory is None:
            return []
        names = []
        for entry in sorted(os.listdir(self.directory)):
            stem, suffix = os.path.splitext(entry)
            if suffix.lower() in SUFFIXES and _CLIP_NAME.fullmatch(stem) and self.clip(entry) is not None:
                names.append(stem)
        return names

    def listing(self, facts: EngineFacts) -> list[ListedVoice]:
        """Every voice a request may name, by source in resolution order (OpenAI's names last,
        and only those that nothing else already names)."""
        voices = [ListedVoice(name, "mapped", self._languages(value, facts)) for name, value in self.mapping.items()]
        if facts.clones:
            voices.extend(ListedVoice(name, "clip") for name in self.clips())
            if self.store is not None:
                voices.extend(ListedVoice(info.name or info.id, "uploaded", stored=info) for info in self.store.list())
        voices.extend(ListedVoice(voice.name, "engine", voice.languages) for voice in facts.voices)
        taken = {voice.name for voice in voices}
        voices.extend(ListedVoice(name, "openai") for name in sorted(OPENAI_VOICES - taken))
        return voices

    @staticmethod
    def _languages(value: Union[str, None], facts: EngineFacts) -> tuple[str, ...]:
        voice = facts.voice(value) if value else None
        return voice.languages if voice is not None else ()
