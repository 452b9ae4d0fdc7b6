"""A batch of IndexTTS requests: upstream's generators stepped in lockstep, their parked model
calls run together (``_lockstep.py`` steps the workers, ``_batched.py`` batches the calls).

:class:`BatchRun` is the coordinator, on the engine thread; each request's own worker thread
runs upstream's ``infer`` to its end, one thread at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Union, cast

from .. import BatchItem, EngineError, ItemDone, ProgressFn, SynthesisRequest, heartbeat
from ._batched import Decoding, Hooks, run_calls, set_decoding
from ._install import Flavour
from ._lockstep import Blocked, Chunk, End, Failed, Lockstep, Report
from ._pcm import UNIT_SCALE_CEILING, as_numpy, peak, to_pcm16
from ._segments import SegmentTexts
from ._stream import HEARTBEAT_INTERVAL, NATIVE_SAMPLE_RATE, Tally, failed_reference
from ._voice_cache import VoiceCache

__all__ = ["BatchMember", "BatchRun"]


class BatchMember:
    """One request of a batch: its upstream stream as the coordinator sees it."""

    def __init__(self, item: BatchItem[Any], flavour: Flavour, kwargs: dict[str, Any]) -> None:
        self.item = item
        self.kwargs = kwargs
        self.texts = SegmentTexts()
        self.tally = Tally(flavour, self.texts)
        self.silence_after_each = flavour.silence_after_each
        self.chunks = 0
        self.restored = False
        self.prepared = False
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
    """The coordinator of one batch: steps each request's worker, runs their parked calls together."""

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
    ) -> None:
        self.model = model
        self.flavour = flavour
        self.items = items
        self.voices = voices
        self.segment_texts = segment_texts
        self.members: dict[int, BatchMember] = {}
        self.early: list[tuple[int, ItemDone]] = []
        self.worker_of: dict[int, int] = {}
        starts: list[Callable[[], Iterator[Any]]] = []
        contexts: list[Decoding] = []
        memo: dict[Any, Any] = {}  # per-voice results the batch's requests share (_batched.py)
        for index, item in enumerate(items):
            try:
                kwargs = prepare(item.request)
            except EngineError as exc:
                self.early.append((index, ItemDone(exc)))
                continue
            context = Decoding(
                greedy=getattr(item.request.options, "do_sample", None) is False,
                num_beams=getattr(item.request.options, "num_beams", None),
                seed=getattr(item.request.options, "seed", None),
                batch_vocoder=batch_vocoder,
                memo=memo,
            )
            self.worker_of[index] = len(starts)
            starts.append(self._starter(kwargs, context))
            contexts.append(context)
            self.members[index] = BatchMember(item, flavour, kwargs)
        self.lockstep = Lockstep(starts)
        for context in contexts:
            context.batch = self.lockstep

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

    def close(self) -> None:
        self.lockstep.close()

    def _step(self, index: int) -> Report:
        member = self.members[index]
        worker = self.worker_of[index]
        if member.chunks == 0:
            stage, message = "prepare", "preparing the references and the first segment"
        else:
            stage, message = "synthesize", f"generating segment {member.tally.segments + 1}"
        progress = member.item.progress
        with heartbeat(progress, stage, None, message, HEARTBEAT_INTERVAL):
            return self.lockstep.step(worker)

    def run(self, hooks: Hooks) -> Iterator[tuple[int, Union[Any, ItemDone]]]:
        yield from self.early
        live = list(self.members)
        reports: dict[int, Report] = {}
        voices = self.voices
        segment_texts = self.segment_texts
        for index in list(live):
            member = self.members[index]
            if member.item.cancelled():
                self.lockstep.abort(self.worker_of[index])
                live.remove(index)
                yield index, ItemDone(None)
                continue
            member.restored = voices.restore(self.model, member.voice)
            segment_texts.start()
            member.item.progress("prepare", None, f"in a batch of {len(self.members)}")
            member.item.progress("prepare", None, "preparing the references and the first segment")
            reports[index] = self._step(index)
            member.texts.texts = list(segment_texts.texts)
            if isinstance(reports[index], Blocked) and not member.restored:
                voices.remember(self.model, member.voice, member.emotion_path)
        while live:
            # Drain: every worker that is not parked on a model call moves on until it is (or ends).
            for index in list(live):
                member = self.members[index]
                report = reports[index]
                while isinstance(report, Chunk):
                    yield from ((index, pcm) for pcm in member.audio(report.value))
                    if member.item.cancelled():
                        self.lockstep.abort(self.worker_of[index])
                        report = End()
                        break
                    report = self._step(index)
                if isinstance(report, Failed):
                    live.remove(index)
                    yield index, ItemDone(member.failure(report.error))
                elif isinstance(report, End):
                    live.remove(index)
                    tally = member.tally
                    member.item.progress(
                        "synthesize", 1.0, f"{tally.segments} segments, {tally.seconds:.2f} s of audio"
                    )
                    yield index, ItemDone(None)
                reports[index] = report
            if not live:
                break
            calls = [cast_blocked(reports[index]).call for index in live]
            progresses = [self.members[index].item.progress for index in live]

            def beat(message: str, progresses: list[ProgressFn] = progresses) -> heartbeat:
                def fan_out(stage: str, fraction: Union[float, None] = None, text: str = "") -> None:
                    for progress in progresses:
                        progress(stage, fraction, text)

                return heartbeat(cast(ProgressFn, fan_out), "synthesize", None, message, HEARTBEAT_INTERVAL)

            run_calls(hooks, calls, beat)
            for index in list(live):
                member = self.members[index]
                if member.item.cancelled():
                    self.lockstep.abort(self.worker_of[index])
                    live.remove(index)
                    yield index, ItemDone(None)
                    continue
                reports[index] = self._step(index)


def cast_blocked(report: Report) -> Blocked:
    assert isinstance(report, Blocked), report
    return report
