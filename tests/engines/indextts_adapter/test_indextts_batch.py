"""Batches in the IndexTTS adapter: the lockstep of upstream's generators, the interceptors'
pass-through, the options, and the routing when upstream's calls cannot be reached.

The batched model calls themselves need torch and upstream's modules: they are tested against
the real upstream code in tests/upstream/test_upstream_batching.py.  Here, the lockstep runs plain
Python generators, and the adapter runs the stand-in packages (tests/standin), whose model
has none of upstream's GPT, CFM and vocoder: the adapter must say so and fall back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from indextts_support import ignore_progress, loaded_engine, make_engine, make_request, never, speak

from indextts_sidecar.engines import BatchItem, EngineError, ItemDone, RequestError
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine
from indextts_sidecar.engines.indextts._batched import Decoding, decoding, install, interceptable
from indextts_sidecar.engines.indextts._lockstep import Abort, Blocked, Call, Chunk, End, Failed, Lockstep

# ----------------------------------------------------------------- the lockstep


def _request_like(name: str, steps: int, log: list[str], lockstep: list[Lockstep]) -> Callable[[], Iterator[Any]]:
    """A generator factory shaped like upstream's: a model call parked before each chunk."""

    def start() -> Iterator[Any]:
        def generate() -> Iterator[Any]:
            try:
                for step in range(steps):
                    doubled = lockstep[0].park(Call("model", "same", (name, step), {}))
                    log.append(f"{name} got {doubled}")
                    yield f"{name}:{doubled}"
            finally:
                log.append(f"{name} closed")

        return generate()

    return start


def _run_batches(calls: list[Call]) -> None:
    for call in calls:
        name, step = call.args
        call.result = f"{name}{step}x{len(calls)}"


def test_the_lockstep_runs_each_generator_to_its_end_and_batches_their_parked_calls() -> None:
    log: list[str] = []
    holder: list[Lockstep] = []
    lockstep = Lockstep([_request_like("a", 2, log, holder), _request_like("b", 3, log, holder)])
    holder.append(lockstep)
    threads_before = threading.active_count()
    reports = {i: lockstep.step(i) for i in range(2)}
    chunks: dict[int, list[Any]] = {0: [], 1: []}
    while any(lockstep.alive(i) for i in range(2)):
        live = [i for i in range(2) if lockstep.alive(i)]
        assert all(isinstance(reports[i], Blocked) for i in live), reports
        calls = [reports[i].call for i in live]  # type: ignore[union-attr]
        _run_batches(calls)
        for i in live:
            report = lockstep.step(i)
            while isinstance(report, Chunk):
                chunks[i].append(report.value)
                report = lockstep.step(i)
            reports[i] = report
    # Each generator got its own row of each batch: two rows while both ran, then one.
    assert chunks == {0: ["a:a0x2", "a:a1x2"], 1: ["b:b0x2", "b:b1x2", "b:b2x1"]}
    assert isinstance(reports[0], End) and isinstance(reports[1], End)
    assert log.count("a closed") == log.count("b closed") == 1
    lockstep.close()
    assert threading.active_count() <= threads_before


def test_an_aborted_worker_unwinds_where_it_is_parked_and_the_others_go_on() -> None:
    log: list[str] = []
    holder: list[Lockstep] = []
    lockstep = Lockstep([_request_like("a", 5, log, holder), _request_like("b", 1, log, holder)])
    holder.append(lockstep)
    assert isinstance(lockstep.step(0), Blocked)
    blocked = lockstep.step(1)
    assert isinstance(lockstep.abort(0), End)  # parked on its first call: Abort raised there
    assert log == ["a closed"] and not lockstep.alive(0)
    assert isinstance(blocked, Blocked)
    _run_batches([blocked.call])
    assert lockstep.step(1) == Chunk("b:b0x1")
    assert isinstance(lockstep.step(1), End)
    assert log == ["a closed", "b got b0x1", "b closed"]


def test_a_failing_worker_reports_its_error_and_an_error_set_on_a_call_is_raised_in_its_worker() -> None:
    def broken() -> Iterator[Any]:
        raise ValueError("bad reference")

    log: list[str] = []
    holder: list[Lockstep] = []
    lockstep = Lockstep([broken, _request_like("b", 2, log, holder)])
    holder.append(lockstep)
    failed = lockstep.step(0)
    assert isinstance(failed, Failed) and str(failed.error) == "bad reference"
    blocked = lockstep.step(1)
    assert isinstance(blocked, Blocked)
    blocked.call.error = RuntimeError("the batch failed for this row")
    failed = lockstep.step(1)
    assert isinstance(failed, Failed) and "for this row" in str(failed.error)
    assert log == ["b closed"]


def test_closing_the_lockstep_aborts_every_worker_even_those_never_started() -> None:
    log: list[str] = []
    holder: list[Lockstep] = []
    lockstep = Lockstep([_request_like(name, 3, log, holder) for name in "abc"])
    holder.append(lockstep)
    threads_before = threading.active_count()
    assert isinstance(lockstep.step(0), Blocked)
    _run_batches([Call("model", "same", ("a", 0), {})])  # a result for nobody: harmless
    lockstep.close()
    lockstep.close()  # idempotent
    assert log == ["a closed"]  # b and c never started, so never ran upstream's code
    assert not any(lockstep.alive(i) for i in range(3))
    assert threading.active_count() <= threads_before
    assert issubclass(Abort, BaseException) and not issubclass(Abort, Exception)


def test_a_parked_worker_without_a_result_is_a_coordinator_bug() -> None:
    log: list[str] = []
    holder: list[Lockstep] = []
    lockstep = Lockstep([_request_like("a", 1, log, holder)])
    holder.append(lockstep)
    assert isinstance(lockstep.step(0), Blocked)
    with pytest.raises(RuntimeError, match="without a result"):
        lockstep.step(0)
    lockstep.close()
    assert log == ["a closed"]


def test_a_worker_added_while_the_others_run_joins_their_next_round_and_numbers_on() -> None:
    log: list[str] = []
    holder: list[Lockstep] = []
    lockstep = Lockstep([_request_like("a", 3, log, holder)])
    holder.append(lockstep)
    threads_before = threading.active_count()
    reports: dict[int, Any] = {0: lockstep.step(0)}
    chunks: dict[int, list[Any]] = {0: []}
    rounds = 0
    while any(lockstep.alive(i) for i in range(len(lockstep))):
        if rounds == 1:  # the top of the 2nd round: every live worker parked
            assert lockstep.add(_request_like("b", 2, log, holder)) == 1
            assert len(lockstep) == 2 and lockstep.alive(1)
            chunks[1] = []
            reports[1] = lockstep.step(1)  # its first step: until it parks
        live = [i for i in range(len(lockstep)) if lockstep.alive(i)]
        assert all(isinstance(reports[i], Blocked) for i in live), reports
        _run_batches([reports[i].call for i in live])
        for i in live:
            report = lockstep.step(i)
            while isinstance(report, Chunk):
                chunks[i].append(report.value)
                report = lockstep.step(i)
            reports[i] = report
        rounds += 1
    # b's first call ran in one batch with a's second: two rows, then each its own.
    assert chunks == {0: ["a:a0x1", "a:a1x2", "a:a2x2"], 1: ["b:b0x2", "b:b1x2"]}
    assert log.count("a closed") == log.count("b closed") == 1
    lockstep.close()
    assert threading.active_count() <= threads_before


def test_closing_aborts_added_workers_and_a_closed_lockstep_takes_no_more() -> None:
    log: list[str] = []
    holder: list[Lockstep] = []
    lockstep = Lockstep()  # a batch may start empty: every request joins
    holder.append(lockstep)
    assert len(lockstep) == 0
    assert lockstep.add(_request_like("a", 3, log, holder)) == 0
    assert lockstep.add(_request_like("b", 3, log, holder)) == 1
    assert isinstance(lockstep.step(1), Blocked)
    lockstep.close()
    assert log == ["b closed"]  # a never started; b unwound where it was parked
    assert not lockstep.alive(0) and not lockstep.alive(1)
    with pytest.raises(RuntimeError, match="closed"):
        lockstep.add(_request_like("c", 1, log, holder))
    assert len(lockstep) == 2


# ----------------------------------------------------------------- the interceptors


class _Module:
    """An object with methods, shaped like upstream's torch modules (no torch needed)."""


def _fake_model(seen: list[tuple[str, tuple[Any, ...]]]) -> Any:
    """Upstream's model calls as methods of their classes, as on upstream's torch modules."""

    def recorder(name: str) -> Callable[..., Any]:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append((name, args))
            return name

        return method

    def make(name: str, **methods: Any) -> Any:
        return type(name, (_Module,), methods)()

    estimator = make("DiT", forward=recorder("estimator"))
    cfm = make("CFM", inference=recorder("cfm"), solve_euler=recorder("solve"), in_channels=80, estimator=estimator)
    model = make("IndexTTS2")
    model.gpt = make("UnifiedVoice", inference_speech=recorder("gpt"))
    model.s2mel = make("MyModel", models={"cfm": cfm})
    model.bigvgan = make("BigVGAN", forward=recorder("vocoder"))
    return model


def test_interceptors_pass_every_call_through_unchanged_without_a_decoding_context() -> None:
    seen: list[tuple[str, tuple[Any, ...]]] = []
    model = _fake_model(seen)
    assert interceptable(model) is None
    hooks = install(model)
    assert install(model) is hooks  # once per instance
    assert model.gpt.inference_speech("cond", "text", do_sample=True) == "gpt"
    assert model.s2mel.models["cfm"].inference("mu", "lens", "prompt", "style", None, 25) == "cfm"
    assert model.bigvgan.forward("mel") == "vocoder"
    # Upstream's calls arrive as upstream made them; a context that asks nothing changes nothing.
    with decoding(Decoding()):
        assert model.gpt.inference_speech("cond2", "text2") == "gpt"
    assert [name for name, _ in seen] == ["gpt", "cfm", "vocoder", "gpt"]
    assert seen[0][1] == ("cond", "text") and seen[3][1] == ("cond2", "text2")
    hooks.uninstall()
    assert not {"inference_speech", "inference", "forward"} & (vars(model.gpt).keys() | vars(model.bigvgan).keys())
    assert model.gpt.inference_speech("cond3") == "gpt" and seen[-1] == ("gpt", ("cond3",))


def test_a_model_without_upstreams_calls_is_named_not_intercepted() -> None:
    model = _fake_model([])
    model.s2mel.models = {}
    assert interceptable(model) == "its s2mel has no CFM with solve_euler"
    model = _fake_model([])
    model.gpt.accel_engine = object()
    assert "accel engine" in str(interceptable(model))
    assert interceptable(_Module()) == "its GPT has no inference_speech"


# ----------------------------------------------------------------- options and routing


def test_max_batch_is_an_engine_option_from_1_to_64() -> None:
    assert make_engine(IndexTTS2Engine).max_batch == 1  # upstream's infer, one request at a time
    assert make_engine(IndexTTS25Engine, max_batch=8).max_batch == 8
    for bad in (0, 65, "4"):
        with pytest.raises(msgspec.ValidationError, match="max_batch"):
            make_engine(IndexTTS2Engine, max_batch=bad)


def test_joining_is_on_with_max_batch_2_or_more_and_off_with_use_accel() -> None:
    assert not make_engine(IndexTTS2Engine).joins_batches  # max_batch 1: upstream's infer alone
    assert make_engine(IndexTTS2Engine, max_batch=2).joins_batches
    assert make_engine(IndexTTS25Engine, max_batch=8).joins_batches
    assert not make_engine(IndexTTS2Engine, max_batch=4, join_batches=False).joins_batches
    assert not make_engine(IndexTTS2Engine, max_batch=4, use_accel=True).joins_batches
    assert make_engine(IndexTTS2Engine, max_batch=4, use_accel=False).joins_batches
    with pytest.raises(msgspec.ValidationError, match="join_batches"):
        make_engine(IndexTTS2Engine, join_batches="yes")


def test_greedy_decoding_and_a_seed_are_request_options(voice: str) -> None:
    engine = make_engine(IndexTTS2Engine)
    for options in ({"do_sample": False}, {"do_sample": True}, {"seed": 7}, {"do_sample": False, "seed": 0}):
        engine.check(make_request(IndexTTS2Engine, voice, **options))
    for bad in (-1, 2**63, "7"):
        with pytest.raises(msgspec.ValidationError, match="seed"):
            make_request(IndexTTS2Engine, voice, seed=bad)


def test_an_upstream_without_the_model_calls_refuses_greedy_and_seed_and_runs_batches_one_by_one(
    ckpt: Path, voice: str, tmp_path: Path, standin: Callable[[str], None]
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt, max_batch=4)
    # The stand-in has upstream's infer but none of its GPT, CFM or vocoder objects.
    for options, field in (({"do_sample": False}, "$.options.do_sample"), ({"seed": 3}, "$.options.seed")):
        with pytest.raises(RequestError) as refused:
            engine.check(make_request(IndexTTS2Engine, voice, **options))
        assert (refused.value.code, refused.value.field) == ("unknown_option", field)
        assert "its GPT has no inference_speech" in str(refused.value)
    engine.check(make_request(IndexTTS2Engine, voice, do_sample=True))  # upstream's own default

    texts = ["a b c", "d e", "f"]
    alone = [b"".join(bytes(c) for c in speak(engine, make_request(IndexTTS2Engine, voice, text=t))) for t in texts]
    bad = make_request(IndexTTS2Engine, voice, text="g", seed=1)  # refused at its turn, alone
    requests = [make_request(IndexTTS2Engine, voice, text=t) for t in texts[:2]] + [bad]
    requests.append(make_request(IndexTTS2Engine, voice, text=texts[2]))
    events: dict[int, list[tuple[Any, ...]]] = {i: [] for i in range(4)}
    items = [BatchItem(request, _recorder(events[i]), never) for i, request in enumerate(requests)]
    audio: dict[int, bytes] = {i: b"" for i in range(4)}
    ends: dict[int, ItemDone] = {}
    rooms: list[int] = []

    def join(room: int) -> list[BatchItem[Any]]:
        rooms.append(room)
        return []

    assert engine.joins_batches  # as the options say: the upstream is not known before load
    for index, chunk in engine.synthesize_batch(items, join):
        assert index not in ends, "a chunk after the item ended"
        if isinstance(chunk, ItemDone):
            ends[index] = chunk
        else:
            audio[index] += bytes(chunk)
    assert [audio[0], audio[1], audio[3]] == alone
    assert ends[0].error is None and ends[1].error is None and ends[3].error is None
    assert isinstance(ends[2].error, EngineError) and ends[2].error.field == "$.options.seed"
    assert any("segment 1 ready" in e[2] for e in events[3])
    assert rooms == []  # one after another: nobody joins


def _recorder(events: list[tuple[Any, ...]]) -> Any:
    def progress(*args: Any) -> None:
        events.append(args)

    return progress


def test_a_cancelled_item_of_a_batch_run_one_by_one_ends_without_its_audio(
    ckpt: Path, voice: str, standin: Callable[[str], None]
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt, max_batch=2)
    items = [
        BatchItem(make_request(IndexTTS2Engine, voice, text="a b c"), ignore_progress, lambda: True),
        BatchItem(make_request(IndexTTS2Engine, voice, text="d"), ignore_progress, never),
    ]
    out = list(engine.synthesize_batch(items))
    assert [(i, type(c).__name__) for i, c in out if i == 0] == [(0, "ItemDone")]
    assert out[-1][0] == 1 and isinstance(out[-1][1], ItemDone) and out[-1][1].error is None
