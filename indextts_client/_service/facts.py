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
            languages=tuple(lang.casefold() for lang in languages if isinstance(lang, str)),
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
        """Whether the engine speaks in a voice from a clip: it declares ``voice_clone``, or at
        least does not declare named voices of its own (``voices``) without it.  espeak names
        its voices and clones none; IndexTTS declares ``voice_clone``; the fake engine takes any."""
        return "voice_clone" in self.capabilities or "voices" not in self.capabilities

    @property
    def granularity(self) -> str:
        """What the words of its requests are: ``word`` where the engine reports word timings
        (the ``word_timings`` capability: espeak, the fake engine), else ``segment`` (the
        engine's segments stand in for its words: IndexTTS)."""
        return "word" if "word_timings" in self.capabilities else "segment"

    def voice(self, name: str) -> Union[EngineVoice, None]:
        """The engine voice ``name`` names, or None: its name, its identifier (or the identifier's
        last part), else the voice whose first language it is, else any voice of that language;
        in any case, with any ``+variant`` (espeak's) set aside."""
        folded = name.partition("+")[0].casefold()
        if not folded:
            return None
        for matches in (
            lambda voice: folded in voice.names(),
            lambda voice: voice.languages[:1] == (folded,),
            lambda voice: folded in voice.languages,
        ):
            for voice in self.voices:
                if matches(voice):
                    return voice
        return None

    def spoken(self, name: str) -> Union[str, None]:
        """What the sidecar gets for engine voice ``name``: the voice's identifier (the one name
        the engine always takes), its ``+variant`` kept; None when no voice has that name."""
        voice = self.voice(name)
        if voice is None:
            return None
        _, plus, variant = name.partition("+")
        return (voice.identifier or voice.name) + plus + variant

    @staticmethod
    def voices_of(entries: Sequence[Mapping[str, Any]]) -> tuple[EngineVoice, ...]:
        found = (EngineVoice.of(entry) for entry in entries)
        return tuple(voice for voice in found if voice is not None)
