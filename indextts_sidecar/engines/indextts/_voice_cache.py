"""The conditioning of recent voices, kept so that switching between them skips reprocessing."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Union

__all__ = [
    "EMOTION_CACHE_ATTRIBUTE",
    "EMOTION_KEY_ATTRIBUTE",
    "SPEAKER_CACHE_ATTRIBUTES",
    "SPEAKER_KEY_ATTRIBUTE",
    "VoiceCache",
]

#: Upstream's per-instance reference caches this adapter saves and restores, by the role
#: they play.  Upstream keeps one speaker and one emotion reference, keyed by the path
#: string; a conformance test fails loudly if these attributes are renamed.
SPEAKER_CACHE_ATTRIBUTES = ("cache_spk_cond", "cache_s2mel_style", "cache_s2mel_prompt", "cache_mel")
SPEAKER_KEY_ATTRIBUTE = "cache_spk_audio_prompt"
EMOTION_CACHE_ATTRIBUTE = "cache_emo_cond"
EMOTION_KEY_ATTRIBUTE = "cache_emo_audio_prompt"


def _file_key(path: str) -> Union[tuple[str, int, int], None]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


class VoiceCache:
    """The conditioning of the last ``size`` voices, keyed by file content (path, size, mtime).

    Upstream recomputes a voice's conditioning on every switch and, keyed by the path
    alone, reuses a stale one when a file is overwritten.  Before each request the
    adapter either restores a cached conditioning into upstream's one-slot cache, or
    clears that slot so upstream recomputes; after the first chunk it saves what upstream
    computed.  Runs on the engine thread only.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, int, int], tuple[Any, ...]] = OrderedDict()
        #: The file whose conditioning upstream's own slot holds, as far as this cache knows.
        self._slot: Union[tuple[str, int, int], None] = None
        self.hits = 0
        self.misses = 0

    def stats(self) -> dict[str, int]:
        return {"size": self.size, "entries": len(self._entries), "hits": self.hits, "misses": self.misses}

    def clear(self) -> None:
        self._entries.clear()
        self._slot = None

    def restore(self, model: Any, voice: str) -> bool:
        """Put ``voice``'s conditioning in upstream's slot if cached; else empty the slot."""
        if not all(hasattr(model, name) for name in (*SPEAKER_CACHE_ATTRIBUTES, SPEAKER_KEY_ATTRIBUTE)):
            return False  # an upstream without these caches: nothing to manage
        key = _file_key(voice)
        if key is not None and key == self._slot and getattr(model, SPEAKER_KEY_ATTRIBUTE, None) == voice:
            self.hits += 1  # upstream's own slot already holds this very file
            return True
        entry = self._entries.get(key) if key is not None and self.size else None
        if entry is None:
            self.misses += 1
            # Upstream compares path strings only: make it recompute, the file may have changed.
            setattr(model, SPEAKER_KEY_ATTRIBUTE, None)
            setattr(model, EMOTION_KEY_ATTRIBUTE, None)
            self._slot = None
            return False
        assert key is not None
        self._entries.move_to_end(key)
        self.hits += 1
        speaker, emotion = entry
        for name, value in zip(SPEAKER_CACHE_ATTRIBUTES, speaker, strict=True):
            setattr(model, name, value)
        setattr(model, SPEAKER_KEY_ATTRIBUTE, voice)
        setattr(model, EMOTION_CACHE_ATTRIBUTE, emotion)
        setattr(model, EMOTION_KEY_ATTRIBUTE, voice)
        self._slot = key
        return True

    def remember(self, model: Any, voice: str, emotion_path: Union[str, None]) -> None:
        """Save what upstream computed for ``voice`` (after its first chunk)."""
        key = _file_key(voice)
        if key is None or getattr(model, SPEAKER_KEY_ATTRIBUTE, None) != voice:
            return
        self._slot = key
        if not self.size:
            return
        speaker = tuple(getattr(model, name) for name in SPEAKER_CACHE_ATTRIBUTES)
        # The emotion slot holds the speaker's own clip unless another emotion clip was used.
        emotion = None
        if emotion_path is None and getattr(model, EMOTION_KEY_ATTRIBUTE, None) == voice:
            emotion = getattr(model, EMOTION_CACHE_ATTRIBUTE)
        previous = self._entries.get(key)
        if emotion is None and previous is not None:
            emotion = previous[1]
        if emotion is None:
            return  # a restore must be complete; keep what upstream has for next time
        self._entries[key] = (speaker, emotion)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
