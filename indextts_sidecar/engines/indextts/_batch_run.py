"""A batch of IndexTTS requests: upstream's generators stepped in lockstep, their parked model
calls run together (``_lockstep.py`` steps the workers, ``_batched.py`` batches the calls).

:class:`BatchRun` is the coordinator, on the engine thread; each request's own worker thread
runs upstream's ``infer`` to its end, one thread at a time.  Requests may join a running
batch (continuous batching): at the top of each round, when every request is parked on a
model call, the sidecar's ``join`` hands over those that arrived meanwhile; each is prepared
as the first ones were, runs until it parks, and its call runs in that round with the others.

Which stages run batched is the engine option ``batch_stages`` (:data:`ROW_WISE`): with
``"all"`` every parked call of a round runs grouped with its like; with ``"gpt"`` only the
GPT's decoding does, and a request parked on the GPT's latent pass, the s2mel CFM or the
vocoder runs that call alone and goes on at once, until its audio is out and it parks on its
next GPT call, before the next request's latent pass: each request's audio leaves as soon as
its own work is done, instead of after the whole batch's.  (The latent pass is one forward over
a segment's positions, compute-bound on a CPU like the CFM: four rows in one pass cost about
what four passes of one do, and grouped, the first request's CFM waited for every row's.)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Union, cast

from .. import BatchItem, Cancelled, EngineError, ItemDone, Join, ProgressFn, SynthesisRequest, heartbeat
from ._batched import Decoding, Hooks, run_calls, set_decoding
from ._install import Flavour
from ._lockstep import Blocked, Chunk, End, Failed, Lockstep, Report
from ._pcm import UNIT_SCALE_CEILING, as_numpy, peak, to_pcm16
from ._profile import Knobs
from ._segments import SegmentTexts
from ._stream import HEARTBEAT_INTERVAL, NATIVE_SAMPLE_RATE, Tally, failed_reference
from ._upstream import StageTimes
from ._voice_cache import VoiceCache

__all__ = ["ROW_WISE", "BatchMember", "BatchRun", "one_after_another", "request_decoding", "resolve_stages"]

log = logging.getLogger("indextts_sidecar.engines.indextts")

#: Per ``batch_stages`` (resolved: ``auto`` is not a key): the kinds of parked call that run one
#: request at a time, as each request reaches them, instead of grouped with the others'.
ROW_WISE: dict[str, frozenset[str]] = {"all": frozenset(), "gpt": frozenset({"latent", "cfm", "vocoder"})}


def resolve_stages(chosen: str, device: Any) -> str:
    """``batch_stages`` resolved for the model's device: ``auto`` is ``gpt`` on a CPU, ``all`` elsewhere."""
    if chosen != "auto":
        return str(chosen)
    return "gpt" if str(device or "").startswith("cpu") else "all"


class BatchMember:
    """One request of a batch: its upstream stream as the coordinator sees it."""

    def __init__(self, item: BatchItem[Any], flavour: Flavour, kwargs: dict[str, Any], worker: int) -> None:
        self.item = item
        self.kwargs = kwargs
        #: Its worker in the batch's lockstep.
        self.worker = worker
        self.texts = SegmentTexts()
        self.tally = Tally(flavour, self.texts)
        self.silence_after_each = flavour.silence_after_each
        self.chunks = 0
        self.restored = False
        #: Whether its worker ran (it was not cancelled before its first step).
        self.started = False
        #: The stage times upstream printed while its worker ran (its done's facts).
        self.times = StageTimes()
        self.voice = str(item.request.voice)
        self.emotion_path: Union[str, None] = kwargs.get("emo_audio_prompt")

    def audio(self, chunk: Any) -> Iterator[Any]:
        """Upstream's next chunk, as a lone request's stream treats it (``_adapter.py``): silences held back."""
        is_silence = self.silence_after_each and self.chunks % 2 == 1
        self.chunks += 1
        if isinstance(chunk, tuple) and len(chunk) == 2 and not hasattr(chunk[0], "shape"):
            rate, audio = chunk  # a flavour that answered with the whole audio at once
            if int(rate) != NATIVE_SAMPLE_RATE:
                raise EngineError(f"the model returned {rate} Hz audio, not {NATIVE_SAMPLE_RATE} Hz", code="internal")
            unit = self.tally.unit_scale and peak(as_numpy(audio)) <= UNIT_SCALE_CEILING
            yield to_pcm16(audio, unit_scale=unit)
            return
        if is_silence:
            self.tally.held = None if isinstance(chunk, (list, tuple)) else chunk
        else:
            yield from self.tally.segment(chunk, self.item.progress)

    def failure(self, exc: BaseException) -> EngineError:
        if isinstance(exc, EngineError):
            return exc
        if self.chunks == 0:
            return EngineError(
                f"preparing the references failed: {type(exc).__name__}: {exc}",
                field=failed_reference(exc, self.voice, self.emotion_path),
            )
        return EngineError(f"{type(exc).__name__}: {exc}")


class BatchRun:
    """The coordinator of one batch: steps each request's worker, runs their parked calls together.

    With ``join``, requests join the batch while it runs, up to ``max_batch`` at once; their
    indices go on from the items given so far.
    """

    def __init__(
        self,
        model: Any,
        flavour: Flavour,
        items: Sequence[BatchItem[Any]],
        *,
        prepare: Callable[[SynthesisRequest[Any]], dict[str, Any]],
        voices: VoiceCache,
        segment_texts: SegmentTexts,
        batch_vocoder: bool,
        max_batch: int,
        join: Union[Join, None] = None,
        batch_stages: str = "all",
        first_segment_tokens: Callable[[SynthesisRequest[Any]], Union[int, None]] = lambda request: None,
        decoding: Union[Callable[..., Decoding], None] = None,
        facts: Callable[[SynthesisRequest[Any]], dict[str, Any]] = lambda request: {},
    ) -> None:
        self.model = model
        self.flavour = flavour
        self.prepare = prepare
        self.voices = voices
        self.segment_texts = segment_texts
        self.batch_vocoder = batch_vocoder
        self.batch_stages = batch_stages
        self.first_segment_tokens = first_segment_tokens
        #: A request's decoding context, given the batch's fields (the adapter's: its knobs too).
        self.decoding = decoding or request_decoding
        self.knob_facts = facts
        self.row_wise = ROW_WISE[batch_stages]
        self.max_batch = max_batch
        self.join = join
        self.members: dict[int, BatchMember] = {}
        self.early: list[tuple[int, ItemDone]] = []
        self.given = 0  # items given so far, joiners included: the next one's index
        #: Per-voice results the batch's requests share (_batched.py): keyed by the very
        #: conditioning tensors a result came from, so a joiner finds only what is its own.
        self.memo: dict[Any, Any] = {}
        self.lockstep = Lockstep()
        for item in items:
            self._admit(item)

    def _admit(self, item: BatchItem[Any]) -> Union[int, None]:
        """Number ``item`` and give it a worker; None when its request fails at once (in ``early``)."""
        index = self.given
        self.given += 1
        try:
            kwargs = self.prepare(item.request)
        except EngineError as exc:
            self.early.append((index, ItemDone(exc)))
            return None
        context = self.decoding(item.request, batch=self.lockstep, batch_vocoder=self.batch_vocoder, memo=self.memo)
        worker = self.lockstep.add(self._starter(kwargs, context))
        self.members[index] = BatchMember(item, self.flavour, kwargs, worker)
        return index

    def _starter(self, kwargs: dict[str, Any], context: Decoding) -> Callable[[], Iterator[Any]]:
        model, flavour = self.model, self.flavour

        def start() -> Iterator[Any]:
            # This worker thread runs this one request to its end: its context stays set.
            set_decoding(context)
            call = model.infer_generator if flavour.streams_with_generator else model.infer
            result = call(**kwargs)
            if isinstance(result, tuple):
                return iter([result])
            if result is None or isinstance(result, (str, bytes, os.PathLike)):
                raise EngineError(f"the model returned {result!r} instead of audio", code="internal")
            return iter(result)

        return start

    def facts(self, index: int) -> dict[str, Any]:
        """What a lone request's ``done`` says (``request_facts``), for item ``index`` once it ended."""
        member = self.members.get(index)
        if member is None or not member.started:
            return {}
        return {
            "voice_cache": "hit" if member.restored else "miss",
            "stages": dict(member.times.stages),
            "batch_stages": self.batch_stages,
            **self.knob_facts(member.item.request),
        }

    def close(self) -> None:
        self.lockstep.close()

    def _step(self, index: int) -> Report:
        member = self.members[index]
        if member.chunks == 0:
            stage, message = "prepare", "preparing the references and the first segment"
        else:
            stage, message = "synthesize", f"generating segment {member.tally.segments + 1}"
        progress = member.item.progress
        with heartbeat(progress, stage, None, message, HEARTBEAT_INTERVAL), member.times.capturing():
            return self.lockstep.step(member.worker)

    def _take_early(self) -> list[tuple[int, ItemDone]]:
        early, self.early = self.early, []
        return early

    def _enter(
        self, index: int, live: list[int], reports: dict[int, Report], note: Union[str, None]
    ) -> Iterator[tuple[int, ItemDone]]:
        """Start item ``index``'s worker: its voice, its segment texts, its first step (until it parks)."""
        member = self.members[index]
        if member.item.cancelled():
            self.lockstep.abort(member.worker)
            yield index, ItemDone(None)
            return
        live.append(index)
        member.started = True
        member.restored = self.voices.restore(self.model, member.voice)
        self.segment_texts.start(self.first_segment_tokens(member.item.request))
        if note is not None:
            member.item.progress("prepare", None, note)
        member.item.progress("prepare", None, "preparing the references and the first segment")
        reports[index] = self._step(index)
        member.texts.texts = list(self.segment_texts.texts)
        if isinstance(reports[index], Blocked) and not member.restored:
            self.voices.remember(self.model, member.voice, member.emotion_path)

    def _joining(self, live: list[int], reports: dict[int, Report]) -> Iterator[tuple[int, ItemDone]]:
        """At the top of a round (every live worker parked): the requests that join now, entered."""
        assert self.join is not None
        room = self.max_batch - len(live)
        if room <= 0:
            return
        joiners = self.join(room)
        if len(joiners) > room:
            raise EngineError(f"{len(joiners)} requests joined a batch with room for {room}", code="internal")
        admitted = [index for index in map(self._admit, joiners) if index is not None]
        yield from self._take_early()
        if len(self.memo) > self.max_batch:
            # Each request adds its voice's entries: bounded while requests come and go.  The
            # live ones compute theirs again (the same result, from the same tensors).
            self.memo.clear()
        size = len(live) + len(admitted)
        for index in admitted:
            yield from self._enter(index, live, reports, f"joined a batch of {size}")

    def _drain(self, live: list[int], reports: dict[int, Report]) -> Iterator[tuple[int, Union[Any, ItemDone]]]:
        """Every worker that is not parked on a model call moves on until it is (or ends)."""
        for index in list(live):
            yield from self._drain_one(index, live, reports)

    def _drain_one(
        self, index: int, live: list[int], reports: dict[int, Report]
    ) -> Iterator[tuple[int, Union[Any, ItemDone]]]:
        member = self.members[index]
        report = reports[index]
        while isinstance(report, Chunk):
            yield from ((index, pcm) for pcm in member.audio(report.value))
            if member.item.cancelled():
                self.lockstep.abort(member.worker)
                report = End()
                break
            report = self._step(index)
        if isinstance(report, Failed):
            live.remove(index)
            yield index, ItemDone(member.failure(report.error))
        elif isinstance(report, End):
            live.remove(index)
            tally = member.tally
            member.item.progress("synthesize", 1.0, f"{tally.segments} segments, {tally.seconds:.2f} s of audio")
            yield index, ItemDone(None)
        reports[index] = report

    def _alone(
        self, hooks: Hooks, index: int, live: list[int], reports: dict[int, Report]
    ) -> Iterator[tuple[int, Union[Any, ItemDone]]]:
        """Request ``index``'s row-wise calls, one after another, its audio out as soon as it is
        ready: until it parks on a call that runs grouped (or ends)."""
        member = self.members[index]
        while index in live:
            report = reports[index]
            if not (isinstance(report, Blocked) and report.call.kind in self.row_wise):
                return
            if member.item.cancelled():
                self.lockstep.abort(member.worker)
                live.remove(index)
                yield index, ItemDone(None)
                return
            run_calls(hooks, [report.call], _beat([member.item.progress]))
            reports[index] = self._step(index)
            yield from self._drain_one(index, live, reports)

    def run(self, hooks: Hooks) -> Iterator[tuple[int, Union[Any, ItemDone]]]:
        yield from self._take_early()
        live: list[int] = []
        reports: dict[int, Report] = {}
        first = list(self.members)
        note = f"in a batch of {len(first)}" if len(first) > 1 else None  # a lone request: as synthesize
        for index in first:
            yield from self._enter(index, live, reports, note)
        while live:
            yield from self._drain(live, reports)
            if live and self.join is not None:
                yield from self._joining(live, reports)
                yield from self._drain(live, reports)  # a joiner that did not park at once
            if not live:
                break
            alone = [index for index in live if cast_blocked(reports[index]).call.kind in self.row_wise]
            # Those with no audio out yet first (a joiner, its codes decoded beside the others'
            # next segments): the others' audio is already playing, a joiner's caller hears nothing
            # until its own rows are done.  Otherwise in the batch's order.
            alone.sort(key=lambda index: self.members[index].chunks > 0)
            for index in alone:
                yield from self._alone(hooks, index, live, reports)
            # Every live request is parked on a grouped call now, those that ran alone too: their
            # next segment's GPT joins the others' in this round.
            grouped = list(live)
            if not grouped:
                break
            calls = [cast_blocked(reports[index]).call for index in grouped]
            run_calls(hooks, calls, _beat([self.members[index].item.progress for index in grouped]))
            for index in grouped:
                member = self.members[index]
                if member.item.cancelled():
                    self.lockstep.abort(member.worker)
                    live.remove(index)
                    yield index, ItemDone(None)
                    continue
                reports[index] = self._step(index)


def request_decoding(request: SynthesisRequest[Any], knobs: Union[Knobs, None] = None, **batch: Any) -> Decoding:
    """``request``'s decoding context: greedy or not, its seed, ``knobs`` (None: its own
    ``num_beams`` alone), and ``batch``'s fields."""
    options = request.options
    if knobs is None:
        knobs = Knobs(num_beams=getattr(options, "num_beams", None))
    return Decoding(
        greedy=getattr(options, "do_sample", None) is False,
        num_beams=knobs.num_beams,
        seed=getattr(options, "seed", None),
        diffusion_steps=knobs.diffusion_steps,
        cfg_rate=knobs.cfg_rate,
        bf16_s2mel=bool(knobs.bf16_s2mel),
        bf16_vocoder=bool(knobs.bf16_vocoder),
        **batch,
    )


def _beat(progresses: list[ProgressFn]) -> Callable[[str], heartbeat]:
    """``run_calls``'s heartbeat: each message to every request whose call runs."""

    def beat(message: str) -> heartbeat:
        def fan_out(stage: str, fraction: Union[float, None] = None, text: str = "") -> None:
            for progress in progresses:
                progress(stage, fraction, text)

        return heartbeat(cast(ProgressFn, fan_out), "synthesize", None, message, HEARTBEAT_INTERVAL)

    return beat


def cast_blocked(report: Report) -> Blocked:
    assert isinstance(report, Blocked), report
    return report


def one_after_another(
    synthesize: Callable[[SynthesisRequest[Any], ProgressFn, Callable[[], bool]], Iterator[Any]],
    items: Sequence[BatchItem[Any]],
) -> Iterator[tuple[int, Union[Any, ItemDone]]]:
    """A batch where upstream's calls cannot be intercepted: each request alone, in turn (none joins)."""
    for index, item in enumerate(items):
        try:
            for chunk in synthesize(item.request, item.progress, item.cancelled):
                yield index, chunk
        except Cancelled:
            yield index, ItemDone(None)
        except EngineError as exc:
            yield index, ItemDone(exc)
        except Exception as exc:
            log.error("engine failed on a request of a batch", exc_info=True)
            yield index, ItemDone(EngineError(f"{type(exc).__name__}: {exc}"))
        else:
            yield index, ItemDone(None)
