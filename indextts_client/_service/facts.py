"""What the service knows of its engine: from the sidecar's ``ready`` and ``voices``, never
from importing the engine's class here (a third-party engine may live only in the sidecar's venv)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from indextts_sidecar.protocol.engine_info import SpeedControl

__all__ = ["EngineFacts", "EngineVoice"]


@dataclass(frozen=True)
class EngineVoice:
    """One of the engine's own voices (espeak's ``en-gb``): spoken by its name."""

    name: str
    languages: tuple[str, ...] = ()
    #: The engine's own identifier for it, when it has one besides the name (espeak: ``gmw/en-GB``).
    identifier: Union[str, None] = None

    def names(self) -> frozenset[str]:
        """The words, folded, that name this voice."""
        identifier = self.identifier or ""
        words = (self.name, identifier, identifier.rpartition("/")[2], *self.languages)
        return frozenset(word.casefold() for word in words if word)

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> Union[EngineVoice, None]:
        """From one entry of the sidecar's ``voices`` answer; None when it has no usable name."""
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            return None
        languages = entry.get("languages") or ()
        identifier = entry.get("identifier")
        return cls(
            name=name,
            languages=tuple(str(lang) for lang in languages if isinstance(lang, str)),
            identifier=identifier if isinstance(identifier, str) and identifier != name else None,
        )


@dataclass(frozen=True)
class EngineFacts:
    """The engine's name, capabilities, speed control and voices, as the sidecar told them."""

    name: str = ""
    capabilities: tuple[str, ...] = ()
    speed: Union[SpeedControl, None] = None
    voices: tuple[EngineVoice, ...] = ()

    @property
    def clones(self) -> bool:
        """Whether the engine speaks in a voice from a clip (the ``voice_clone`` capability)."""
        return "voice_clone" in self.capabilities

    def voice(self, name: str) -> Union[EngineVoice, None]:
        """The engine voice ``name`` names, or None: its name, its identifier (or the identifier's
        last part) or one of its languages, in any case, with any ``+variant`` (espeak's) set aside."""
        folded = name.partition("+")[0].casefold()
        if not folded:
            return None
        for voice in self.voices:
            if folded in voice.names():
                return voice
        return None

    @staticmethod
    def voices_of(entries: Sequence[Mapping[str, Any]]) -> tuple[EngineVoice, ...]:
        found = (EngineVoice.of(entry) for entry in entries)
        return tuple(voice for voice in found if voice is not None)
