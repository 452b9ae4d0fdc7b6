"""Real (robotic) speech from the espeak-ng C library, driven through ctypes.

Small, CPU-only and fast to load, so it serves as the engine for end-to-end tests and
for hosts without a GPU.  The library and its data come from the ``espeakng-loader``
wheel, imported in :meth:`EspeakEngine.load` so that importing this module costs only
the standard library and msgspec.

espeak-ng keeps its state in process globals (one voice, one set of parameters, one
callback), so one engine instance owns the library; the sidecar's single engine thread
makes that safe without locks.

Word timings (``word_timings``) come from espeak-ng's own word events (``espeakEVENT_WORD``),
read by :func:`sentence_words`; each sentence's words are yielded as
:class:`~indextts_sidecar.engines.Words` just before the sentence's audio.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import re
import sys
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any

import msgspec

from ..protocol import WordSpan
from ..protocol.segments import segment_message
from . import Chunk, Engine, EngineError, LoadError, ProgressFn, RequestError, SpeedControl, SynthesisRequest, Words

__all__ = [
    "EspeakEngine",
    "EspeakOptions",
    "EspeakRequestOptions",
    "sentence_spans",
    "sentence_words",
    "split_sentences",
    "language_voices",
    "voice_known",
    "voice_table",
]

log = logging.getLogger(__name__)

# Constants from espeak-ng's speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
# Without this flag a failed espeak_Initialize calls exit(1) and takes the sidecar down.
_INITIALIZE_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
# Keeps the sentence-final pause, which espeak otherwise drops at the end of each call;
# we call once per sentence, so without it sentences would run together.
_ENDPAUSE = 0x1000
_POS_CHARACTER = 1
_RATE = 1
_PITCH = 3
_EE_OK = 0
_EE_NOT_FOUND = 2
# espeak_EVENT_TYPE: the list's end, a word's start, a clause's or sentence's end.
_EVENT_LIST_TERMINATED = 0
_EVENT_WORD = 1
_EVENT_END = 5
#: Audio per callback: also how quickly a cancel interrupts a sentence.
_BUFFER_MS = 100

#: Why the engine cannot load without the ``espeakng-loader`` wheel: names the extra that brings it.
_NOT_INSTALLED = (
    "espeak-ng is not installed: install the [espeak] extra in the engine's interpreter "
    '(from the clone: pip install -e ".[espeak]"; it brings espeakng-loader)'
)

RATE_RANGE = (80, 450)
PITCH_RANGE = (0, 100)

# After sentence punctuation followed by space (so "3.14" stays whole), or at newlines.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?;])\s+|\s*\n\s*")


def _unknown_voice(voice: str) -> str:
    return (
        f"unknown espeak-ng voice {voice!r}; use a language or voice name such as 'en', 'en-us', 'de' or 'fr' "
        "(client.voices() lists them)"
    )


def split_sentences(text: str) -> list[str]:
    """``text`` cut into sentences, punctuation kept, blank pieces dropped."""
    return [text[start:end] for start, end in sentence_spans(text)]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Where :func:`split_sentences`' sentences lie in ``text``: ``(start, end)`` offsets."""
    spans = []
    start = 0
    for pause in (*_SENTENCE_BREAK.finditer(text), None):
        end = len(text) if pause is None else pause.start()
        piece = text[start:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            spans.append((start + lead, start + len(piece.rstrip())))
        if pause is not None:
            start = pause.end()
    return spans


#: An event as kept from the callback: (type, text_position, length, sample).
Event = tuple[int, int, int, int]


def sentence_words(
    text: str, start: int, end: int, events: Sequence[Event], samples: int, offset: int
) -> list[WordSpan]:
    """The words of the sentence ``text[start:end]``, timed by espeak-ng's word events, as spans of ``text``.

    ``events`` are espeak's own for that one ``espeak_Synth`` call (the sentence alone):
    ``espeakEVENT_WORD`` gives a word's 1-based position in the sentence and its length, both
    in characters (code points: "Grüße" is 5, as in Python), and ``sample``, its first sample
    in the call's audio, ``samples`` long; ``offset`` is where that audio begins in the request.

    Every whitespace-separated word of the sentence is in exactly one span, whole, in order,
    whatever espeak made of it: espeak reports part of a word ("Don" of "Don't", "5" of
    "5th"), several words for one ("1,234", "3/4/2021", "日本"), none for a word it runs into
    its neighbour ("am" in "I am fine", "the" before a number), or a length 0 (a word in
    quotes).  So each event names the words its characters touch; the events of one word
    make one span, timed by the first; a word without an event of its own joins the span
    before it (the first span, for the words before it), never dropped; an event that names
    no character, only spaces, is not a word (a symbol spoken as several).  A span loses the
    punctuation at its edges unless it is nothing else ("&"), so a word of punctuation alone
    ("—") that espeak does not speak is no word; spans never overlap, and starts strictly
    increase.

    A span ends where the next begins, or at espeak's next clause end (``espeakEVENT_END``)
    if that comes first and the span took no word after its own event's, the last at the
    end of the sentence's audio (espeak's own end of the sentence, its closing pause
    included): the silence after a word counts as the word's.
    """
    sentence = text[start:end]
    size = len(sentence)
    tokens = [(m.start(), m.end()) for m in re.finditer(r"\S+", sentence)]
    if not tokens:
        return []
    token_ends = [last for _, last in tokens]

    def token_at(char: int) -> int:
        """The word that holds ``char``, or the first after it (the last word past the end)."""
        return min(bisect.bisect_right(token_ends, char), len(tokens) - 1)

    groups: list[list[int]] = []  # [first word, last word, first sample], words indexing ``tokens``
    clause_ends: list[int] = []
    for kind, position, length, sample in events:
        sample = min(max(sample, 0), samples)
        if kind == _EVENT_END:
            clause_ends.append(sample)
            continue
        if kind != _EVENT_WORD:
            continue
        first = min(max(position - 1, 0), size)
        last = min(first + max(length, 0), size)
        if length <= 0:  # the word that starts there
            while last < size and not sentence[last].isspace():
                last += 1
        while first < last and sentence[first].isspace():
            first += 1
        while last > first and sentence[last - 1].isspace():
            last -= 1
        if first == last:
            continue
        first_word, last_word = token_at(first), token_at(last - 1)
        if groups and (first_word <= groups[-1][1] or sample <= groups[-1][2]):
            groups[-1][1] = max(groups[-1][1], last_word)
            continue
        groups.append([first_word, last_word, sample])
    if not groups:  # espeak named no word: the sentence is one span
        groups.append([0, len(tokens) - 1, 0])
    groups[0][0] = 0  # the words before the first event join the first span
    words = []
    for index, (first_word, named_last, sample) in enumerate(groups):
        following = groups[index + 1] if index + 1 < len(groups) else None
        # The words up to the next span's, without events of their own, join this one.
        last_word = following[0] - 1 if following is not None else len(tokens) - 1
        stop = following[2] if following is not None else samples
        if last_word == named_last:  # no word joined after it: it may end at its clause's end
            stop = min([stop, *(at for at in clause_ends if at > sample)])
        first, last = _trim_word(sentence, tokens[first_word][0], tokens[last_word][1])
        words.append(WordSpan(start + first, start + last, offset + sample, offset + max(stop, sample)))
    return words


def _word_like(char: str) -> bool:
    return char.isalnum() or unicodedata.category(char).startswith("M")


def _trim_word(sentence: str, first: int, last: int) -> tuple[int, int]:
    """``[first, last)`` without spaces at its edges, nor punctuation unless it is nothing else."""
    while first < last and sentence[first].isspace():
        first += 1
    while last > first and sentence[last - 1].isspace():
        last -= 1
    core_first, core_last = first, last
    while core_first < core_last and not _word_like(sentence[core_first]):
        core_first += 1
    while core_last > core_first and not _word_like(sentence[core_last - 1]):
        core_last -= 1
    return (core_first, core_last) if core_first < core_last else (first, last)


def _check_range(field: str, value: int, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise ValueError(f"`{field}` must be in {low}..{high}, got {value}")


def _data_path() -> str | None:
    """espeak-ng's data directory from the ``espeakng-loader`` wheel, or None without it."""
    try:
        import espeakng_loader  # type: ignore[import-untyped]

        return str(espeakng_loader.get_data_path())
    except (ImportError, RuntimeError, OSError):
        return None


@functools.lru_cache(maxsize=4)
def voice_table(data_path: str) -> tuple[tuple[dict[str, Any], ...], frozenset[str]]:
    """The voices under ``data_path`` and every name ``espeak_SetVoiceByName`` takes for one.

    Read from the voice files themselves (``lang/`` holds the voices, ``voices/!v`` the
    ``+variant`` files), so checking a name needs neither the library nor its one thread.
    A voice is found by its ``name`` line, one of its ``language`` codes or its file path
    (``gmw/en-US``, or ``en-US`` alone), in any case.  Returns the voices (``name``,
    ``identifier``, ``languages``) and those names, lower-cased.
    """
    voices: list[dict[str, Any]] = []
    known: set[str] = set()
    for root_name in ("lang", "voices"):
        root = os.path.join(data_path, root_name)
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            relative_folder = os.path.relpath(folder, root).replace(os.sep, "/")
            if relative_folder != ".":
                known.add(relative_folder.lower())
            for file in sorted(files):
                identifier = file if relative_folder == "." else f"{relative_folder}/{file}"
                name, languages = _read_voice_file(os.path.join(folder, file))
                known.update(key.lower() for key in (identifier, file, *languages, *([name] if name else [])))
                if root_name == "lang" and name:
                    voices.append({"name": name, "identifier": identifier, "languages": languages})
    known.discard("variant")  # the language of every variant file, not a voice
    voices.sort(key=lambda voice: str(voice["identifier"]))
    return tuple(voices), frozenset(known)


def _read_voice_file(path: str) -> tuple[str | None, list[str]]:
    name: str | None = None
    languages: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                key, _, rest = line.strip().partition(" ")
                # A name line may end in a comment ("Cherokee //https://..."), as any line may.
                rest = rest.partition("//")[0]
                if key == "name" and rest.strip() and name is None:
                    name = rest.strip()
                elif key == "language" and rest.split():
                    languages.append(rest.split()[0])
    except OSError:
        pass
    return name, languages


@functools.lru_cache(maxsize=4)
def language_voices(data_path: str) -> dict[str, str]:
    """Each name and language code a voice file declares (lower-cased), to the identifier of
    the first voice with it.  ``espeak_SetVoiceByName`` takes file paths, but not every name
    or language code ``voices()`` lists (``en-gb``, ``zh``, ``fr-fr``, ``Cherokee``...)."""
    table: dict[str, str] = {}
    for voice in voice_table(data_path)[0]:
        for key in (voice["name"], *voice["languages"]):
            table.setdefault(str(key).lower(), str(voice["identifier"]))
    return table


def voice_known(voice: str, known: frozenset[str]) -> bool:
    """Whether espeak-ng would take ``voice`` (``NAME`` or ``NAME+VARIANT``; an unknown variant is ignored)."""
    base = voice.partition("+")[0]
    return base == base.strip() and base.lower() in known


class EspeakOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Engine options: defaults for every request."""

    #: espeak-ng voice or language name ("en", "en-us", "de", "fr", "en+f3"...).
    voice: str = "en"
    #: Speaking rate in words per minute.
    rate: int = 175
    #: Base pitch, 0..100.
    pitch: int = 50

    def __post_init__(self) -> None:
        # Runs on plain construction as well as on msgspec.convert, unlike Meta bounds.
        _check_range("rate", self.rate, RATE_RANGE)
        _check_range("pitch", self.pitch, PITCH_RANGE)


class EspeakRequestOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Per-request overrides of the engine options; None keeps the engine's value."""

    # msgspec evaluates these at runtime; ``Annotated[...] | None`` works from 3.10 on.
    # Meta bounds make msgspec's error name the field ("... - at `$.rate`").
    rate: Annotated[int, msgspec.Meta(ge=RATE_RANGE[0], le=RATE_RANGE[1])] | None = None
    pitch: Annotated[int, msgspec.Meta(ge=PITCH_RANGE[0], le=PITCH_RANGE[1])] | None = None


class EspeakEngine(Engine[EspeakOptions, EspeakRequestOptions]):
    """espeak-ng speech, streamed one sentence at a time."""

    name = "espeak"
    native_sample_rate = 22050
    capabilities = ("streaming", "voices", "word_timings")
    speed = SpeedControl(option="rate", normal=175, minimum=RATE_RANGE[0], maximum=RATE_RANGE[1], integer=True)
    Options = EspeakOptions
    RequestOptions = EspeakRequestOptions

    def __init__(self, options: EspeakOptions) -> None:
        super().__init__(options)
        self._lib: Any = None
        # The CFUNCTYPE object must outlive every call into the library: if it were
        # collected, espeak would call into freed memory.
        self._callback: Any = None
        self._samples: list[bytes] = []
        #: The current sentence's word and clause-end events (see :data:`Event`).
        self._events: list[Event] = []
        self._cancelled: Callable[[], bool] = lambda: False
        self._callback_error: BaseException | None = None

    @property
    def loaded(self) -> bool:
        return self._lib is not None

    def check(self, request: SynthesisRequest[EspeakRequestOptions]) -> None:
        if not request.text.strip():
            raise RequestError("text is empty", field="text")
        voice = request.voice
        if voice is not None and (not voice.strip() or "\0" in voice):
            raise RequestError(f"invalid espeak-ng voice name {voice!r}", field="voice")
        if voice is not None:
            # Before queueing: an unknown voice fails now, not after the requests ahead of it.
            data_path = _data_path()
            if data_path is not None and not voice_known(voice, voice_table(data_path)[1]):
                raise RequestError(_unknown_voice(voice), field="voice")

    def voices(self) -> list[dict[str, Any]] | None:
        data_path = _data_path()
        return [] if data_path is None else [dict(voice) for voice in voice_table(data_path)[0]]

    @classmethod
    def probe(cls) -> str | None:
        import importlib.util

        if importlib.util.find_spec("espeakng_loader") is None:
            return _NOT_INSTALLED
        data_path = _data_path()
        if data_path is None or not os.path.isfile(os.path.join(data_path, "phontab")):
            return f"espeak-ng data is missing or incomplete at {data_path}"
        return None

    def load(self, progress: ProgressFn, cancelled: Callable[[], bool]) -> None:
        if self._lib is not None:
            progress("load", 1.0, "ready")
            return
        progress("load", 0.0, "loading libespeak-ng")
        import ctypes

        try:
            import espeakng_loader

            lib_path = espeakng_loader.get_library_path()
            data_path = espeakng_loader.get_data_path()
        except (ImportError, RuntimeError) as exc:
            raise LoadError(f"{_NOT_INSTALLED} ({type(exc).__name__}: {exc})") from exc
        # espeak falls back to a compiled-in path when ours lacks data, then fails with
        # only a stderr message: check first so the error says what is wrong.
        if not os.path.isfile(os.path.join(data_path, "phontab")):
            raise LoadError(f"espeak-ng data is missing or incomplete at {data_path}")
        try:
            lib = ctypes.CDLL(lib_path)
        except OSError as exc:
            raise LoadError(f"cannot load libespeak-ng from {lib_path}: {exc}") from exc

        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,  # text
            ctypes.c_size_t,  # size in bytes, terminator included
            ctypes.c_uint,  # position
            ctypes.c_int,  # position type
            ctypes.c_uint,  # end position (0: none)
            ctypes.c_uint,  # flags
            ctypes.c_void_p,  # unique identifier out (unused)
            ctypes.c_void_p,  # user data
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_Terminate.argtypes = []
        lib.espeak_Terminate.restype = ctypes.c_int
        event_type = _event_struct(ctypes)
        callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(event_type))
        lib.espeak_SetSynthCallback.argtypes = [callback_type]
        lib.espeak_SetSynthCallback.restype = None

        # Either the data directory or its parent works; pass the directory itself.
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, os.fsencode(data_path), _INITIALIZE_DONT_EXIT
        )
        if rate <= 0:  # with DONT_EXIT a failure returns 0, older builds a negative code
            raise LoadError(f"espeak_Initialize failed ({rate}) with data at {data_path}")

        def on_audio(wav: int | None, numsamples: int, events: Any) -> int:
            # An exception cannot cross the C frame: keep it, abort, re-raise after Synth.
            try:
                if wav and numsamples > 0:
                    self._samples.append(ctypes.string_at(wav, numsamples * 2))
                if events:
                    index = 0
                    while (event := events[index]).type != _EVENT_LIST_TERMINATED:
                        if event.type in (_EVENT_WORD, _EVENT_END):
                            self._events.append((event.type, event.text_position, event.length, event.sample))
                        index += 1
                return 1 if self._cancelled() else 0
            except BaseException as exc:  # re-raised after espeak_Synth returns
                self._callback_error = exc
                return 1

        self._callback = callback_type(on_audio)
        lib.espeak_SetSynthCallback(self._callback)
        self._lib = lib
        self.sample_rate = rate
        if rate != self.native_sample_rate:
            # Harmless (we report what the library returned) but worth knowing.
            log.warning("espeak-ng runs at %d Hz, not the expected %d Hz", rate, self.native_sample_rate)
        progress("load", 1.0, "ready")

    def synthesize(
        self,
        request: SynthesisRequest[EspeakRequestOptions],
        progress: ProgressFn,
        cancelled: Callable[[], bool],
    ) -> Iterator[Chunk]:
        lib = self._lib
        if lib is None:
            raise EngineError("espeak engine is not loaded")
        opts = request.options
        voice = request.voice if request.voice is not None else self.options.voice
        # Voice first: the parameters below are set for the voice now current, and are
        # set on every request because espeak keeps them between calls.
        status = lib.espeak_SetVoiceByName(voice.encode("utf-8"))
        data_path = _data_path()
        if status == _EE_NOT_FOUND and data_path is not None:
            # A name or language code the voice files list that the library does not take:
            # the voice file that declares it, with the variant asked for.
            base, plus, variant = voice.partition("+")
            by_language = language_voices(data_path).get(base.lower())
            if by_language is not None:
                status = lib.espeak_SetVoiceByName(f"{by_language}{plus}{variant}".encode())
        if status == _EE_NOT_FOUND:
            raise RequestError(_unknown_voice(voice), field="voice")
        if status != _EE_OK:
            raise EngineError(f"espeak_SetVoiceByName({voice!r}) failed ({status})")
        lib.espeak_SetParameter(_RATE, opts.rate if opts.rate is not None else self.options.rate, 0)
        lib.espeak_SetParameter(_PITCH, opts.pitch if opts.pitch is not None else self.options.pitch, 0)

        # espeak reads to the first NUL, so one inside the text would cut it short (a space
        # for it keeps the offsets of the segment messages those of the request's text).
        text = request.text.replace("\0", " ")
        spans = sentence_spans(text)
        self._cancelled = cancelled
        offset = 0  # samples of the request before this sentence's
        try:
            for done, (start, end) in enumerate(spans, 1):
                sentence = text[start:end].encode("utf-8")
                self._samples = []
                self._events = []
                self._callback_error = None
                status = lib.espeak_Synth(
                    sentence, len(sentence) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _ENDPAUSE, None, None
                )
                if self._callback_error is not None:
                    raise self._callback_error
                if status != _EE_OK:
                    raise EngineError(f"espeak_Synth failed ({status})")
                if cancelled():
                    return  # a sentence cut short by the callback is dropped, not sent
                audio = b"".join(self._samples)
                if sys.byteorder == "big":  # espeak writes native-endian samples
                    import array

                    samples = array.array("h", audio)
                    samples.byteswap()
                    audio = samples.tobytes()
                # Before the sentence's audio: the parent marks that audio with the sentence's span.
                progress("synthesize", done / len(spans), segment_message(start, end))
                words = sentence_words(text, start, end, self._events, len(audio) // 2, offset)
                if words:
                    yield Words(words)
                if audio:
                    yield audio
                offset += len(audio) // 2
        finally:
            self._samples = []
            self._events = []
            self._cancelled = lambda: False

    def unload(self) -> None:
        if self._lib is None:
            return
        self._lib.espeak_Terminate()
        self._lib = None
        self._callback = None


def _event_struct(ctypes: Any) -> Any:
    """``espeak_EVENT`` (speak_lib.h) as a ctypes structure; ``ctypes`` is passed in, imported at load."""

    class EventId(ctypes.Union):  # type: ignore[misc]
        _fields_ = (("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8))

    class Event(ctypes.Structure):  # type: ignore[misc]
        _fields_ = (
            ("type", ctypes.c_int),  # espeak_EVENT_TYPE
            ("unique_identifier", ctypes.c_uint),
            ("text_position", ctypes.c_int),  # 1-based, in characters of the text given
            ("length", ctypes.c_int),  # the word's, in characters
            ("audio_position", ctypes.c_int),  # milliseconds
            ("sample", ctypes.c_int),  # samples since the start of the call's audio
            ("user_data", ctypes.c_void_p),
            ("id", EventId),
        )

    return Event
