"""The engine interface, and engines found by name.

An engine turns text into int16 mono PCM.  The sidecar calls every method except
:meth:`Engine.check` and :meth:`Engine.memory` on its one engine worker thread, one call
at a time, so an engine needs no locking and may wrap a library that is not
thread-safe.  Engines import their heavy dependencies inside :meth:`Engine.load`, never
at module level: the sidecar imports the engine's module before it sends ``ready``.

Built-in engines are ``fake``, ``espeak``, ``indextts2``, ``indextts2.5`` and
``indextts``.  Third-party engines register an :class:`Engine` subclass in the entry
point group ``indextts_sidecar.engines``::

    [project.entry-points."indextts_sidecar.engines"]
    myengine = "mypackage.engine:MyEngine"
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar, Union

import msgspec

from ..protocol import Emotion, WordSpan
from ..protocol.engine_info import EngineDescription, SpeedControl  # shared with the client; named here too

__all__ = [
    "ENTRY_POINT_GROUP",
    "BatchItem",
    "Cancelled",
    "Chunk",
    "Engine",
    "EngineDescription",
    "EngineError",
    "ItemDone",
    "Join",
    "LoadError",
    "NoOptions",
    "ProgressFn",
    "RequestError",
    "SpeedControl",
    "SynthesisRequest",
    "WordSpan",
    "Words",
    "describe_engine",
    "engine_class",
    "engine_names",
    "heartbeat",
]

ENTRY_POINT_GROUP = "indextts_sidecar.engines"

#: Built-in engines: name -> "module:Class", imported only when chosen.
_BUILTIN = {
    "fake": "indextts_sidecar.engines.fake:FakeEngine",
    "espeak": "indextts_sidecar.engines.espeak:EspeakEngine",
    "indextts": "indextts_sidecar.engines.indextts:IndexTTSAuto",
    "indextts2": "indextts_sidecar.engines.indextts:IndexTTS2Engine",
    "indextts2.5": "indextts_sidecar.engines.indextts:IndexTTS25Engine",
}

#: Little-endian int16 mono samples: bytes, bytearray, memoryview or an int16 array.
Chunk = Any


class ProgressFn(Protocol):
    def __call__(self, stage: str, fraction: Union[float, None] = None, message: str = "") -> None: ...


class EngineError(Exception):
    """An error an engine reports for one request; ``code`` is the wire error code."""

    code: str = "engine_error"
    retryable: bool = False

    def __init__(self, message: str, *, field: Union[str, None] = None, code: Union[str, None] = None) -> None:
        super().__init__(message)
        self.field = field
        if code is not None:
            self.code = code


class RequestError(EngineError):
    """The request cannot be served as given (a missing file, a value out of range)."""

    code = "invalid_input"


class LoadError(EngineError):
    """The model failed to load; the next request tries again."""

    code = "load_failed"
    retryable = True


class Cancelled(Exception):
    """Raised by an engine that noticed cancellation inside a long step."""


class NoOptions(msgspec.Struct, forbid_unknown_fields=True):
    """Options struct for an engine that takes none."""


OptionsT = TypeVar("OptionsT", bound=msgspec.Struct)
RequestOptionsT = TypeVar("RequestOptionsT", bound=msgspec.Struct)


@dataclass(frozen=True)
class SynthesisRequest(Generic[RequestOptionsT]):
    """One ``synthesize`` request as an engine sees it, with options already validated."""

    id: int
    text: str
    voice: Union[str, None]
    emotion: Union[Emotion, None]
    options: RequestOptionsT
    #: The rate the parent asked for; the sidecar resamples, engines produce their native rate.
    sample_rate: Union[int, None] = None
    #: The parent streams the audio as it comes (``synthesize.stream``): first audio matters most.
    stream: bool = False


@dataclass(frozen=True)
class BatchItem(Generic[RequestOptionsT]):
    """One request of a batch, as the engine sees it (see :meth:`Engine.synthesize_batch`)."""

    request: SynthesisRequest[RequestOptionsT]
    #: This request's own progress (segment messages etc.).
    progress: ProgressFn
    #: True once this request was cancelled or missed its deadline: drop it at its next step.
    cancelled: Callable[[], bool]


#: What an engine that :attr:`~Engine.joins_batches` gets as :meth:`Engine.synthesize_batch`'s
#: ``join``.  Called on the engine thread at a step boundary with the room the batch has left
#: (``max_batch`` less the items not yet ended), it returns the requests that join the running
#: batch now: at most that many, often none.  Joiners are numbered on from the items given so
#: far: after a batch of 3, the first joiner's index is 3.  It returns none once the sidecar
#: wants the batch to end (a job of another kind waits, or the sidecar is closing).
Join = Callable[[int], Sequence[BatchItem[Any]]]


class ItemDone:
    """Yielded as ``(index, ItemDone(error))`` by :meth:`Engine.synthesize_batch` to end one item early.

    ``error`` None ends the item successfully at once; an :class:`EngineError` fails only that item.
    """

    __slots__ = ("error",)

    def __init__(self, error: Union[EngineError, None] = None) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"ItemDone({self.error!r})"


class Words:
    """Yielded among its chunks by :meth:`Engine.synthesize` (as ``(index, Words(...))`` by
    :meth:`Engine.synthesize_batch`): when the words it holds are spoken.

    Each :class:`WordSpan` names characters of the request's text and samples counted from the
    request's first sample at the engine's :attr:`Engine.sample_rate`.  Yield a word no later
    than the chunk that holds its first sample (before that chunk): the sidecar
    sends the words it holds with the next audio frame of the request, and those left at the
    end with ``done``.  Engines that report words say so with the ``word_timings`` capability.
    """

    __slots__ = ("words",)

    def __init__(self, words: Sequence[WordSpan]) -> None:
        self.words = tuple(words)

    def __repr__(self) -> str:
        return f"Words({list(self.words)!r})"


class Engine(Generic[OptionsT, RequestOptionsT]):
    """Base class of engines.  Subclasses set the class attributes and override the methods."""

    #: Name the engine is found by.
    name: ClassVar[str] = ""
    #: The native rate when known without loading, else None until :meth:`load`.
    native_sample_rate: ClassVar[Union[int, None]] = None
    #: Free-form feature names advertised in ``ready`` (``streaming``, ``voice_clone``...).
    capabilities: ClassVar[tuple[str, ...]] = ()
    #: The request option that changes the speaking speed, and its range; None: no speed control.
    speed: ClassVar[Union[SpeedControl, None]] = None
    #: Engine (command-line) options; unknown fields are rejected.
    Options: ClassVar[type[msgspec.Struct]] = NoOptions
    #: Per-request ``options``; unknown fields are rejected, naming the field.
    RequestOptions: ClassVar[type[msgspec.Struct]] = NoOptions

    def __init__(self, options: OptionsT) -> None:
        self.options = options
        #: Engine options accepted on the command line but not by the installed library.
        self.dropped_options: list[str] = []
        self.sample_rate: Union[int, None] = self.native_sample_rate

    @property
    def loaded(self) -> bool:
        raise NotImplementedError

    @property
    def reads_paths(self) -> bool:
        """Whether ``voice`` and an emotion ``path`` name files this engine reads.

        The sidecar's path policy then checks them before :meth:`check` runs. By default,
        engines that advertise ``voice_clone``.
        """
        return "voice_clone" in self.capabilities

    def check(self, request: SynthesisRequest[RequestOptionsT]) -> None:
        """Cheap validation on the event loop thread before queueing; raise :class:`RequestError`."""

    def load(self, progress: ProgressFn, cancelled: Callable[[], bool]) -> None:
        """Load the model, reporting progress; set :attr:`sample_rate`.  Raise on failure."""
        raise NotImplementedError

    def synthesize(
        self,
        request: SynthesisRequest[RequestOptionsT],
        progress: ProgressFn,
        cancelled: Callable[[], bool],
    ) -> Iterator[Chunk]:
        """Yield int16 chunks at :attr:`sample_rate`; the sidecar stops at a chunk boundary on cancel.

        An engine with the ``word_timings`` capability also yields :class:`Words` among them.

        The sidecar writes each chunk to the pipe from the engine's own buffer, without
        copying it: never modify a chunk after yielding it.
        """
        raise NotImplementedError

    @property
    def max_batch(self) -> int:
        """How many requests :meth:`synthesize_batch` takes at most; 1 (the default): never batched.

        May depend on the engine options; read once, before ``ready``, so it must not need the model.
        """
        return 1

    @property
    def joins_batches(self) -> bool:
        """Whether :meth:`synthesize_batch` takes new requests while it runs (its ``join``).

        Such an engine (with :attr:`max_batch` 2 or more) gets every ``synthesize`` job through
        :meth:`synthesize_batch`, a lone one as a batch of one, with a :data:`Join` to call at
        its step boundaries: requests that arrive while a batch runs join it at its next step
        (continuous batching) instead of waiting for its end.  Read once, like :attr:`max_batch`.
        """
        return False

    def synthesize_batch(
        self, items: Sequence[BatchItem[RequestOptionsT]], join: Union[Join, None] = None
    ) -> Iterator[tuple[int, Union[Chunk, Words, ItemDone]]]:
        """Synthesize 2..:attr:`max_batch` requests at once; on the engine thread, after :meth:`load`.

        A lone request still goes to :meth:`synthesize`, unless the engine :attr:`joins_batches`:
        then it comes here as a batch of one, and ``join`` (None otherwise) hands the batch the
        requests that arrive while it runs; their indices go on from the items'.  Yields ``(index into items, chunk)``
        in any interleaving, each chunk int16 at :attr:`sample_rate` as for :meth:`synthesize`
        (never modified after it is yielded), and ``(index, Words(...))`` as :meth:`synthesize` does.
        ``(index, ItemDone(None))`` ends that item successfully at once, ``(index,
        ItemDone(err))`` fails only that item with ``err``.  Items not ended when the generator
        returns end successfully; an exception escaping the generator fails every item not yet
        ended.  The engine should drop an item whose
        ``cancelled()`` is True at its next step: the sidecar has already answered it and
        discards its later chunks.
        """
        raise NotImplementedError

    def unload(self) -> None:
        """Drop the model and free its memory."""

    def request_facts(self) -> dict[str, Any]:
        """Facts about the request :meth:`synthesize` just finished, for its ``done.facts``
        (``voice_cache``: ``hit`` when the voice's conditioning was reused, ``miss`` when it
        was computed); called on the engine thread after the last chunk; msgpack-able.  In a
        batch, called right after an item's ``ItemDone(None)`` for that item's facts (and once
        when a batch of one ends without one)."""
        return {}

    def info(self) -> dict[str, Any]:
        """Facts about the loaded model for ``load``'s reply (which model, from where); msgpack-able."""
        return {}

    def memory(self) -> dict[str, int]:
        """Engine memory in bytes, e.g. ``cuda_allocated``; called from the event loop thread."""
        return {}

    def voices(self) -> Union[list[dict[str, Any]], None]:
        """The engine's named voices (each a map with at least ``name``), or None when it has none.

        Called from the event loop thread without loading the model: keep it cheap.
        """
        return None

    @classmethod
    def probe(cls) -> Union[str, None]:
        """Why this engine cannot run in this interpreter (a missing dependency), or None.

        Cheap and import-free where possible (``importlib.util.find_spec``): it runs for
        ``--describe-engines`` and the doctor, never when serving.
        """
        return None


def describe_engine(name: str) -> EngineDescription:
    """The facts about engine ``name`` in this interpreter; never raises."""
    try:
        cls = engine_class(name)
    except Exception as exc:  # a broken third-party entry point: report it, do not fail the listing
        return EngineDescription(name=name, problem=f"{type(exc).__name__}: {exc}")
    doc = (cls.__doc__ or "").strip().splitlines()
    try:
        problem = cls.probe()
    except Exception as exc:
        problem = f"probe failed: {type(exc).__name__}: {exc}"
    return EngineDescription(
        name=name,
        description=doc[0] if doc else "",
        native_sample_rate=cls.native_sample_rate,
        max_batch=_default_max_batch(cls),
        capabilities=list(cls.capabilities),
        available=problem is None,
        problem=problem,
        speed=cls.speed,
    )


def _default_max_batch(cls: type[Engine[Any, Any]]) -> int:
    """``max_batch`` of the engine with its default options (engines import nothing before load); 1 on failure."""
    try:
        return max(1, int(cls(msgspec.convert({}, cls.Options)).max_batch))
    except Exception:
        return 1


class heartbeat:
    """Report ``stage`` every ``interval`` seconds while a long blocking step runs.

    Keeps a parent's idle deadline alive through steps that are slow but healthy, such
    as constructing a model.  Used as ``with heartbeat(progress, "load", 0.5, "constructing"):``.
    """

    def __init__(
        self, progress: ProgressFn, stage: str, fraction: Union[float, None], message: str, interval: float = 2.0
    ) -> None:
        self._args = (progress, stage, fraction, message, interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="indextts-heartbeat", daemon=True)

    def _run(self) -> None:
        progress, stage, fraction, message, interval = self._args
        while not self._stop.wait(interval):
            progress(stage, fraction, message)

    def __enter__(self) -> heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def engine_names() -> list[str]:
    """Names of the built-in engines and of those registered through entry points."""
    from importlib.metadata import entry_points

    names = set(_BUILTIN)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def engine_class(name: str) -> type[Engine[Any, Any]]:
    """The engine class registered as ``name``; raises ``LookupError`` naming the known engines."""
    target = _BUILTIN.get(name)
    if target is None:
        from importlib.metadata import entry_points

        matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not matches:
            raise LookupError(f"unknown engine {name!r}; known engines: {', '.join(engine_names())}")
        loaded = matches[0].load()
    else:
        module_name, _, attr = target.partition(":")
        loaded = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(loaded, type) and issubclass(loaded, Engine)):
        raise LookupError(f"engine {name!r} does not name an Engine subclass: {loaded!r}")
    return loaded
