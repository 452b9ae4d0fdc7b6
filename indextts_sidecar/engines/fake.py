"""A deterministic engine with fault injection, for this project's tests and yours.

The audio is a function of the text alone: each character becomes ``seconds_per_char``
of a sine tone whose pitch depends on the character (amplitude 8000, never silence).
:func:`render` computes the exact samples a request produces, so a test can compare
what it received byte for byte.  The ``synthesize`` progress before each chunk names the
characters whose tones the chunk holds (:mod:`indextts_sidecar.protocol.segments`).

Word timings (the ``word_timings`` capability): each run of non-whitespace characters of
the text is a word, spoken by its characters' tones, samples ``[first char's start, last
char's end)``; :func:`words` computes them.  The engine yields each word as
:class:`~indextts_sidecar.engines.Words` right before the chunk that holds its first
sample.  A ``seconds`` shorter than the text's audio drops the words that start past its
end (and ends a word it cuts at the audio's end); a longer one repeats the text, and the
repeats carry no words (as they carry no segment spans).

Per-request ``options`` inject faults at chunk boundaries: see :class:`FakeRequestOptions`.
Engine options (``--option key=value``) shape loading: see :class:`FakeOptions`.

With ``max_batch=N`` (N >= 2) it batches: :meth:`FakeEngine.synthesize_batch` makes each
request's chunks exactly as :meth:`FakeEngine.synthesize` would, one chunk per request
per step, and pays the simulated compute (``delay``) once per step for the whole batch
(the longest ``delay`` of the requests still in it), as a GPU decoding a batch does.  With
``join_batches`` as well it joins batches: before each step's compute it calls ``join`` and
takes the requests it returns into the batch, each made exactly as alone.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Union

import msgspec

from ..protocol import EMOTION_NAMES, EmotionVector, WordSpan
from ..protocol.segments import segment_message
from . import (
    BatchItem,
    Cancelled,
    Engine,
    EngineError,
    ItemDone,
    Join,
    LoadError,
    ProgressFn,
    RequestError,
    SpeedControl,
    SynthesisRequest,
    Words,
)

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["FakeEngine", "FakeOptions", "FakeRequestOptions", "render", "render_bytes", "words"]

_NonNegative = Annotated[float, msgspec.Meta(ge=0)]
_Count = Annotated[int, msgspec.Meta(ge=0)]
_AMPLITUDE = 8000
_WORD = re.compile(r"\S+")


class FakeOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Engine options of ``fake``."""

    sample_rate: Annotated[int, msgspec.Meta(ge=1000, le=192000)] = 24000
    #: Seconds the model takes to load, reported as 10 progress steps.
    load_delay: _NonNegative = 0.0
    #: The first N loads fail with a ``load_failed`` error.
    load_failures: _Count = 0
    #: Audio per character of text.
    seconds_per_char: Annotated[float, msgspec.Meta(gt=0, le=10)] = 0.06
    #: Seconds of audio per chunk.
    chunk_seconds: Annotated[float, msgspec.Meta(gt=0)] = 0.5
    #: Reject what the real engines reject: empty text, emotion weights outside [0, 1] or
    #: NaN, a ``voice`` that is not a readable file (the sidecar's path policy).
    validate: bool = True
    #: Requests synthesized at once as one batch at most; 1: none (no ``synthesize_batch``).
    max_batch: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    #: With ``max_batch`` >= 2: requests that arrive while a batch runs join it at its next step
    #: (continuous batching; every request then runs through ``synthesize_batch``).
    join_batches: bool = False


class FakeRequestOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Per-request options of ``fake``.  ``*_at`` count chunks from 0."""

    #: Total audio length, overriding the text-derived one.
    seconds: Union[_NonNegative, None] = None
    #: Seconds of audio per chunk, overriding the engine option.
    chunk_seconds: Union[Annotated[float, msgspec.Meta(gt=0)], None] = None
    #: Audio per character, overriding the engine option (what ``speed`` sets).
    seconds_per_char: Union[Annotated[float, msgspec.Meta(ge=0.015, le=0.24)], None] = None
    #: Wall-clock seconds spent before each chunk (simulated compute).
    delay: _NonNegative = 0.0
    #: Raise an ``engine_error`` before chunk N, with ``fail_message``.
    fail_at: Union[_Count, None] = None
    fail_message: str = "injected failure"
    #: Raise a plain ``RuntimeError`` instead: an engine bug, reported with ``detail.traceback``.
    fail_raw: bool = False
    #: Exit the whole process with ``exit_code`` before chunk N (a crash).
    crash_at: Union[_Count, None] = None
    exit_code: Annotated[int, msgspec.Meta(ge=0, le=255)] = 70
    #: With ``crash_at``: crash only the first time, across every process, by creating
    #: this marker file (a crash that a retry on another sidecar survives).
    crash_once: Union[str, None] = None
    #: Block before chunk N until the request is cancelled (a hang).
    hang_at: Union[_Count, None] = None
    #: Lines printed per request, half through ``print`` and half written to fd 1 directly.
    print_lines: _Count = 0
    #: Bytes written to stderr per request (a flood).
    stderr_bytes: _Count = 0
    #: Write what the engine received (text, voice, emotion, these options, sample rate, stream) as
    #: JSON to this file before the first chunk: how a test sees a mapping done upstream of it.
    #: In a batch it adds ``batch``: the ids of the requests that shared a step with this one
    #: (itself included), in the batch's order, rewritten when one joins; and for a request
    #: that joined a running batch, ``joined``: how many steps the batch had run by then.
    record: Union[str, None] = None


def _char_tone(char: str, sample_rate: int, length: int) -> npt.NDArray[Any]:
    import numpy as np

    frequency = 180.0 + (ord(char) % 64) * 15.0
    t = np.arange(length, dtype=np.float64) * (2.0 * math.pi * frequency / sample_rate)
    # Offset the phase so no segment starts at zero: the result is never silent.
    return (np.sin(t + 0.5) * _AMPLITUDE).astype("<i2")


def render(
    text: str, sample_rate: int = 24000, *, seconds: Union[float, None] = None, seconds_per_char: float = 0.06
) -> npt.NDArray[Any]:
    """The exact int16 samples the fake engine produces for ``text`` with these settings."""
    import numpy as np

    per_char = max(1, round(seconds_per_char * sample_rate))
    chars = text or " "
    total = round(seconds * sample_rate) if seconds is not None else per_char * len(chars)
    tones: dict[str, npt.NDArray[Any]] = {}
    parts = []
    produced = 0
    index = 0
    while produced < total:
        char = chars[index % len(chars)]
        tone = tones.get(char)
        if tone is None:
            tone = tones[char] = _char_tone(char, sample_rate, per_char)
        take = min(per_char, total - produced)
        parts.append(tone[:take])
        produced += take
        index += 1
    if not parts:
        return np.zeros(0, dtype="<i2")
    return np.concatenate(parts)


def render_bytes(text: str, sample_rate: int = 24000, **kwargs: Any) -> bytes:
    """:func:`render` as little-endian int16 bytes, as they travel on the wire."""
    return render(text, sample_rate, **kwargs).tobytes()


def words(
    text: str, sample_rate: int = 24000, *, seconds: Union[float, None] = None, seconds_per_char: float = 0.06
) -> list[WordSpan]:
    """The word timings the fake engine reports for ``text`` with these settings (as :func:`render`)."""
    per_char = max(1, round(seconds_per_char * sample_rate))
    total = round(seconds * sample_rate) if seconds is not None else per_char * len(text or " ")
    return _words(text, per_char, total)


def _words(text: str, per_char: int, total: int) -> list[WordSpan]:
    """Each whitespace-separated word of ``text`` that starts within ``total`` samples, at
    ``per_char`` samples per character; none when the audio repeats the text."""
    if total > per_char * len(text):
        return []
    spans = []
    for match in _WORD.finditer(text):
        start = match.start() * per_char
        if start >= total:
            break
        spans.append(WordSpan(match.start(), match.end(), start, min(match.end() * per_char, total)))
    return spans


class FakeEngine(Engine[FakeOptions, FakeRequestOptions]):
    """Deterministic tones from text, with fault injection: a test double for applications."""

    name = "fake"
    #: It takes every kind of emotion (and checks it as IndexTTS does), so that the layers
    #: above can be tested against it.
    capabilities = (
        "streaming",
        "fault_injection",
        "emotion_vector",
        "emotion_audio",
        "emotion_text",
        "word_timings",
    )
    #: Speeds 0.25..4 at the default 0.06 s per character.
    speed = SpeedControl(option="seconds_per_char", normal=0.06, minimum=0.015, maximum=0.24, inverse=True)
    Options = FakeOptions
    RequestOptions = FakeRequestOptions

    def __init__(self, options: FakeOptions) -> None:
        super().__init__(options)
        self.sample_rate = options.sample_rate
        self._loaded = False
        self._loads = 0
        #: The last request's audio as laid out in chunks, by (text, seconds, seconds per char, chunk).
        self._cache: Union[tuple[tuple[str, float | None, float, int], _Layout], None] = None
        #: The voices this process has spoken with: a stand-in for a conditioning cache.
        self._voices_seen: set[str] = set()
        self._request_facts: dict[str, Any] = {}

    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def reads_paths(self) -> bool:
        return self.options.validate

    def check(self, request: SynthesisRequest[FakeRequestOptions]) -> None:
        if request.voice is not None and request.voice.startswith("missing:"):
            raise RequestError(f"voice {request.voice!r} does not exist", field="$.voice")
        if not self.options.validate:
            return
        if not request.text.strip():
            raise RequestError("text is empty", field="$.text")
        emotion = request.emotion
        if isinstance(emotion, EmotionVector):
            for name, value in zip(EMOTION_NAMES, emotion.values(), strict=True):
                if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                    raise RequestError(
                        f"emotion weight {name} must be in [0, 1], got {value}", field=f"$.emotion.{name}"
                    )
            total = math.fsum(emotion.values())
            if total > 1.0 + 1e-6:
                raise RequestError(f"emotion weights sum to {total:g}; the sum must be at most 1", field="$.emotion")
        if emotion is not None and not (math.isfinite(emotion.alpha) and 0.0 <= emotion.alpha <= 1.0):
            raise RequestError(f"emotion alpha must be in [0, 1], got {emotion.alpha}", field="$.emotion.alpha")

    def request_facts(self) -> dict[str, Any]:
        facts, self._request_facts = self._request_facts, {}
        return facts

    def load(self, progress: ProgressFn, cancelled: Callable[[], bool]) -> None:
        self._loads += 1
        steps = 10
        for step in range(steps):
            if cancelled():
                raise Cancelled
            progress("load", step / steps, f"loading step {step + 1} of {steps}")
            if self.options.load_delay:
                time.sleep(self.options.load_delay / steps)
        if self._loads <= self.options.load_failures:
            raise LoadError(f"injected load failure {self._loads} of {self.options.load_failures}")
        import numpy  # noqa: F401  (the real import cost lands in the load, as with a real model)

        progress("load", 1.0, "loaded")
        self._loaded = True

    def unload(self) -> None:
        self._loaded = False
        self._cache = None

    @property
    def max_batch(self) -> int:
        return self.options.max_batch

    @property
    def joins_batches(self) -> bool:
        return self.options.join_batches

    def synthesize(
        self,
        request: SynthesisRequest[FakeRequestOptions],
        progress: ProgressFn,
        cancelled: Callable[[], bool],
    ) -> Iterator[Any]:
        plan = self._plan(request)
        for index in range(plan.count):
            if plan.options.delay:
                _sleep_unless_cancelled(plan.options.delay, cancelled)
            if index == plan.options.fail_at:
                if plan.options.fail_raw:
                    raise RuntimeError(plan.options.fail_message)
                raise EngineError(plan.options.fail_message)
            plan.crash_if_asked(index)
            if index == plan.options.hang_at:
                while not cancelled():
                    time.sleep(0.005)
                raise Cancelled
            if cancelled():
                raise Cancelled
            spoken = plan.words_in(index)
            if spoken:
                yield Words(spoken)
            yield plan.chunk(index, progress)

    def synthesize_batch(
        self, items: Sequence[BatchItem[FakeRequestOptions]], join: Union[Join, None] = None
    ) -> Iterator[tuple[int, Union[Any, Words, ItemDone]]]:
        items = list(items)
        ids = [item.request.id for item in items]
        plans = [self._plan(item.request, batch=ids) for item in items]
        #: Per item, the indices of the items it shared the batch with (itself included).
        shared = [set(range(len(items))) for _ in items]
        self._request_facts = {}
        #: Each request's next chunk; a request leaves ``active`` when it ends or is cancelled.
        next_chunk = [0] * len(items)
        active = []
        steps = 0
        for i, plan in enumerate(plans):
            if plan.count:
                active.append(i)
            else:
                self._request_facts = plan.facts
                yield i, ItemDone()  # no audio at all: done before any step
        while active:
            active = [i for i in active if not items[i].cancelled()]
            if join is not None and active:
                joined = join(self.options.max_batch - len(active))
                for item in joined:
                    i = len(items)
                    items.append(item)
                    ids.append(item.request.id)
                    plans.append(self._plan(item.request, batch=[ids[k] for k in [*active, i]], joined=steps))
                    next_chunk.append(0)
                    shared.append({*active, i})
                    if plans[i].count:
                        active.append(i)
                    else:
                        self._request_facts = plans[i].facts
                        yield i, ItemDone()
                if joined:
                    self._shared_step(active, shared, plans, ids)
            hanging = {i for i in active if next_chunk[i] == plans[i].options.hang_at}
            if active and len(hanging) == len(active):
                time.sleep(0.005)  # every request left hangs: until one is cancelled (or one joins)
                continue
            # One step's compute for the whole batch: the longest delay of those in it.
            delay = max((plans[i].options.delay for i in active), default=0.0)
            if delay:
                _sleep_unless(delay, functools.partial(_all_cancelled, [items[i] for i in active]))
            for i in list(active):
                plan, index = plans[i], next_chunk[i]
                if i in hanging or items[i].cancelled():
                    continue
                if index == plan.options.fail_at:
                    if plan.options.fail_raw:
                        raise RuntimeError(plan.options.fail_message)  # escapes: fails the whole batch
                    active.remove(i)
                    yield i, ItemDone(EngineError(plan.options.fail_message))
                    continue
                plan.crash_if_asked(index)
                next_chunk[i] = index + 1
                spoken = plan.words_in(index)
                if spoken:
                    yield i, Words(spoken)
                yield i, plan.chunk(index, items[i].progress)
                if index + 1 == plan.count:
                    active.remove(i)
                    self._request_facts = plan.facts  # for request_facts() right after it
                    yield i, ItemDone()  # its Done goes out now, not when the batch ends
            steps += 1

    @staticmethod
    def _shared_step(active: list[int], shared: list[set[int]], plans: list[_Plan], ids: list[int]) -> None:
        """Those in ``active`` share the next step: each one's ``record`` names the others too."""
        for i in active:
            record = plans[i].options.record
            if not shared[i].issuperset(active):
                shared[i].update(active)
                if record is not None:
                    _record_batch(record, [ids[k] for k in sorted(shared[i])])

    def _plan(
        self,
        request: SynthesisRequest[FakeRequestOptions],
        batch: Union[list[int], None] = None,
        joined: Union[int, None] = None,
    ) -> _Plan:
        """What a request produces, after its side effects (lines, stderr, record, facts)."""
        opts = request.options
        for line in range(opts.print_lines):
            if line % 2:
                os.write(1, f"fake engine: raw fd 1 line {line} of request {request.id}\n".encode())
            else:
                print(f"fake engine: print() line {line} of request {request.id}", flush=True)
        if opts.stderr_bytes:
            _flood_stderr(opts.stderr_bytes)
        if opts.record is not None:
            _record(opts.record, request, batch, joined)
        self._request_facts = {}
        if request.voice is not None:
            # Bounded by the voices a test uses; a real engine's cache has a size.
            hit = request.voice in self._voices_seen
            self._voices_seen.add(request.voice)
            self._request_facts = {"voice_cache": "hit" if hit else "miss"}
        per_char = opts.seconds_per_char or self.options.seconds_per_char
        chunk = max(1, round((opts.chunk_seconds or self.options.chunk_seconds) * self.options.sample_rate))
        key = (request.text, opts.seconds, per_char, chunk)
        began = time.perf_counter()
        if self._cache is not None and self._cache[0] == key:
            layout = self._cache[1]
        else:
            audio = render(
                request.text,
                self.options.sample_rate,
                seconds=opts.seconds,
                seconds_per_char=per_char,
            )
            char_samples = max(1, round(per_char * self.options.sample_rate))  # as render() lays them out
            layout = _Layout(request.text, audio, chunk, char_samples)
            self._cache = (key, layout)
        self._request_facts["stages"] = {"render": time.perf_counter() - began}
        return _Plan(request, layout, dict(self._request_facts))


class _Layout:
    """A request's audio cut into chunks, with the words each chunk starts and the progress
    message that names its characters: the same for every request of the same text and
    settings, so the engine keeps the last one (the chunks are views of one array, never
    modified)."""

    __slots__ = ("chunks", "count", "messages", "words")

    def __init__(self, text: str, audio: Any, chunk: int, char_samples: int) -> None:
        self.count = max(1, math.ceil(len(audio) / chunk)) if len(audio) else 0
        # A ``seconds`` longer than the text's own audio repeats the text: no span names that.
        spans = bool(text) and len(audio) <= char_samples * len(text)
        words = _words(text, char_samples, len(audio))
        starts = [word.start for word in words]
        self.chunks: list[Any] = []
        self.messages: list[str] = []
        self.words: list[list[WordSpan]] = []
        for index in range(self.count):
            first, end = index * chunk, min((index + 1) * chunk, len(audio))
            self.chunks.append(audio[first:end])
            # The characters whose tones the chunk holds, the one its end cuts included.
            self.messages.append(segment_message(first // char_samples, -(-end // char_samples)) if spans else "")
            # The words whose first sample the chunk holds.
            self.words.append(words[bisect.bisect_left(starts, first) : bisect.bisect_left(starts, first + chunk)])


class _Plan:
    """One request's chunks (its :class:`_Layout`), the options that inject its faults, its facts."""

    __slots__ = ("count", "facts", "layout", "options")

    def __init__(self, request: SynthesisRequest[FakeRequestOptions], layout: _Layout, facts: dict[str, Any]) -> None:
        self.options = request.options
        #: Its ``done.facts`` (``request_facts()``), in a batch too.
        self.facts = facts
        self.layout = layout
        self.count = layout.count

    def crash_if_asked(self, index: int) -> None:
        opts = self.options
        if index == opts.crash_at and (opts.crash_once is None or _first_time(opts.crash_once)):
            sys.stderr.write(f"fake engine: crashing with exit code {opts.exit_code} as asked\n")
            sys.stderr.flush()
            os._exit(opts.exit_code)

    def words_in(self, index: int) -> list[WordSpan]:
        """The words whose first sample chunk ``index`` holds."""
        return self.layout.words[index]

    def chunk(self, index: int, progress: ProgressFn) -> Any:
        """Chunk ``index``, after its ``synthesize`` progress."""
        layout = self.layout
        progress("synthesize", (index + 1) / self.count, layout.messages[index])
        return layout.chunks[index]


def _record(
    path: str, request: SynthesisRequest[FakeRequestOptions], batch: Union[list[int], None], joined: Union[int, None]
) -> None:
    received: dict[str, Any] = {
        "text": request.text,
        "voice": request.voice,
        "emotion": msgspec.to_builtins(request.emotion),
        "options": msgspec.to_builtins(request.options),
        "sample_rate": request.sample_rate,
        "stream": request.stream,
    }
    if batch is not None:
        received["batch"] = batch
    if joined is not None:
        received["joined"] = joined
    with open(path, "wb") as file:
        file.write(msgspec.json.encode(received))


def _record_batch(path: str, batch: list[int]) -> None:
    """Rewrite ``batch`` in the record at ``path`` (a request joined), whole: a reader sees the old or the new."""
    with open(path, "rb") as file:
        received = msgspec.json.decode(file.read())
    received["batch"] = batch
    with open(f"{path}.tmp", "wb") as file:
        file.write(msgspec.json.encode(received))
    os.replace(f"{path}.tmp", path)


def _first_time(marker: str) -> bool:
    """Create ``marker``; False if it already existed."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def _sleep_unless_cancelled(seconds: float, cancelled: Callable[[], bool]) -> None:
    if not _sleep_unless(seconds, cancelled):
        raise Cancelled


def _all_cancelled(items: Sequence[BatchItem[Any]]) -> bool:
    return all(item.cancelled() for item in items)


def _sleep_unless(seconds: float, stop: Callable[[], bool]) -> bool:
    """Sleep ``seconds``, polling ``stop``; False if it came true first."""
    deadline = time.monotonic() + seconds
    while not stop():
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(left, 0.005))
    return False


def _flood_stderr(size: int) -> None:
    line = b"fake engine: stderr flood " + b"x" * 100 + b"\n"
    written = 0
    while written < size:
        piece = line[: size - written]
        os.write(2, piece)
        written += len(piece)
