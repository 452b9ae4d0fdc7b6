"""The scheduler's side of continuous batching, against an engine that steps when the test says.

The engine joins batches: before each step it calls ``join``, reports the ids in its batch,
and waits for the test's go, so the test queues, cancels or closes between two steps of a
running batch, deterministically and without a process.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from indextts_sidecar import protocol
from indextts_sidecar._jobs import Job
from indextts_sidecar._scheduler import Lane, Scheduler
from indextts_sidecar.engines import BatchItem, ItemDone, Join, SynthesisRequest
from indextts_sidecar.engines.fake import FakeEngine, FakeOptions, FakeRequestOptions

TIMEOUT = 30


class _SteppedEngine(FakeEngine):
    """Loaded; each request is ``steps`` chunks of one sample, one per step of the batch.

    ``greedy`` asks ``join`` for more room than the batch has: the scheduler must not grant it.
    ``bad_index`` yields, once a job has joined, a chunk for the index the next joiner would get.
    """

    def __init__(self, max_batch: int, *, steps: int = 3, greedy: bool = False, bad_index: bool = False) -> None:
        super().__init__(FakeOptions(sample_rate=8000, max_batch=max_batch, join_batches=True))
        self._loaded = True
        self.steps = steps
        self.greedy = greedy
        self.bad_index = bad_index
        #: The ids in the batch at each step (after its join), as the engine saw them.
        self.at_step: queue.Queue[list[int]] = queue.Queue()
        self.go: queue.Queue[None] = queue.Queue()
        #: Every batch: its items' ids in index order, joiners included.
        self.batches: list[list[int]] = []

    def synthesize_batch(self, items: Sequence[BatchItem[Any]], join: Join | None = None) -> Iterator[tuple[int, Any]]:
        assert join is not None
        items = list(items)
        self.batches.append([item.request.id for item in items])
        left = {index: self.steps for index in range(len(items))}
        while left:
            for index in [i for i in left if items[i].cancelled()]:
                del left[index]
            for item in join(99 if self.greedy else self.options.max_batch - len(left)):
                left[len(items)] = self.steps
                items.append(item)
                self.batches[-1].append(item.request.id)
            self.at_step.put([items[i].request.id for i in left])
            self.go.get(timeout=TIMEOUT)
            if self.bad_index and len(items) > 1:
                yield len(items), b"\x01\x00"
            for index in list(left):
                yield index, b"\x01\x00"
                left[index] -= 1
                if not left[index]:
                    del left[index]
                    yield index, ItemDone()


class _Output:
    """A connection's end: records terminal frames (in one list for all), drops the rest."""

    frame_bytes = 1 << 20
    frame_words = done_words = 1000

    def __init__(self, name: str, ended: list[tuple[str, int, str]], changed: threading.Condition) -> None:
        self.name = name
        self._ended = ended
        self._changed = changed

    def finish(self, job: Job, message: protocol.Reply) -> None:
        if job.finished:
            return
        job.finished = True
        code = message.code if isinstance(message, protocol.Error) else type(message).__name__
        with self._changed:
            self._ended.append((self.name, job.id, code))
            self._changed.notify_all()

    def send(self, message: protocol.Reply) -> None:
        pass

    def post(self, fn: Any, *args: Any) -> None:
        fn(*args)

    def audio(self, job: Job, seq: int, rate: int, pcm: memoryview, words: Any = ()) -> bool:
        return True

    def progress(self, job: Job, stage: str, fraction: Any, message: str) -> None:
        pass


def _job(job_id: int, kind: str = "synthesize") -> Job:
    request = SynthesisRequest(id=job_id, text="x", voice=None, emotion=None, options=FakeRequestOptions())
    return Job(job_id, kind, request if kind == "synthesize" else None)


class _Bench:
    """A scheduler over a :class:`_SteppedEngine`, its lanes by name, and what ended."""

    def __init__(self, engine: _SteppedEngine, *names: str) -> None:
        self.engine = engine
        self.scheduler = Scheduler(engine)
        self.ended: list[tuple[str, int, str]] = []
        self.changed = threading.Condition()
        self.lanes: dict[str, Lane] = {
            name: self.scheduler.attach(_Output(name, self.ended, self.changed))  # type: ignore[arg-type]
            for name in names
        }

    def queue(self, name: str, job: Job) -> None:
        assert self.scheduler.enqueue(self.lanes[name], job, limit=8) is None

    def step(self) -> list[int]:
        """The ids in the batch at its next step (the engine waits there for :meth:`go`)."""
        return self.engine.at_step.get(timeout=TIMEOUT)

    def go(self) -> None:
        self.engine.go.put(None)

    def until_ended(self, count: int) -> None:
        """Until ``count`` jobs have ended."""
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.ended) >= count, TIMEOUT), self.ended


@pytest.mark.parametrize("greedy", [False, True], ids=["engine_room", "greedy_engine"])
def test_jobs_queued_while_a_batch_runs_join_it_numbered_on_and_within_max_batch(greedy: bool) -> None:
    bench = _Bench(_SteppedEngine(max_batch=2, greedy=greedy), "a", "b")
    try:
        bench.queue("a", _job(1))
        assert bench.step() == [1]  # a lone job: a batch of one
        bench.queue("b", _job(2))
        bench.queue("a", _job(3))
        bench.go()
        # Round robin from the lane after a's: b's job joins; the batch is full, a's 3 waits.
        assert bench.step() == [1, 2]
        bench.go()
        assert bench.step() == [1, 2]
        bench.go()  # 1 ends at its third step; 3 joins at the next
        assert bench.step() == [2, 3]
        bench.go()
        assert bench.step() == [3]  # 2 ended
        bench.go()
        assert bench.step() == [3]
        bench.go()
        bench.until_ended(3)
        assert bench.engine.batches == [[1, 2, 3]]  # indices 0, 1, 2: numbered on
        assert bench.ended == [("a", 1, "Done"), ("b", 2, "Done"), ("a", 3, "Done")]
    finally:
        bench.scheduler.close()
        bench.go()


def test_a_job_of_another_kind_at_a_lane_head_stops_the_joining_until_it_has_run() -> None:
    bench = _Bench(_SteppedEngine(max_batch=4, steps=2), "a", "b")
    try:
        bench.queue("a", _job(1))
        assert bench.step() == [1]
        bench.queue("b", _job(2, "load"))
        bench.queue("a", _job(3))
        bench.go()
        assert bench.step() == [1]  # 3 waits: the batch drains so that b's load runs
        bench.go()
        assert bench.step() == [3]  # a batch of its own, after the load
        bench.go()
        assert bench.step() == [3]
        bench.go()
        bench.until_ended(3)
        assert bench.ended == [("a", 1, "Done"), ("b", 2, "Ok"), ("a", 3, "Done")]
        assert bench.engine.batches == [[1], [3]]
    finally:
        bench.scheduler.close()
        bench.go()


def test_a_joiner_cancelled_is_answered_at_once_and_dropped_at_the_next_step() -> None:
    bench = _Bench(_SteppedEngine(max_batch=4), "a", "b")
    try:
        bench.queue("a", _job(1))
        assert bench.step() == [1]
        bench.queue("b", _job(2))
        bench.go()
        assert bench.step() == [1, 2]
        assert bench.scheduler.cancel(bench.lanes["b"], 2) is True
        assert bench.ended == [("b", 2, "cancelled")]  # before the engine's next step
        assert bench.lanes["b"].running is None
        bench.go()
        assert bench.step() == [1]  # dropped
        bench.go()
        bench.until_ended(2)
        assert bench.ended == [("b", 2, "cancelled"), ("a", 1, "Done")]
    finally:
        bench.scheduler.close()
        bench.go()


def test_close_while_a_batch_with_joiners_runs_lets_it_drain_and_ends_the_thread() -> None:
    bench = _Bench(_SteppedEngine(max_batch=4, steps=2), "a", "b")
    bench.queue("a", _job(1))
    assert bench.step() == [1]
    bench.queue("b", _job(2))
    bench.go()
    assert bench.step() == [1, 2]
    bench.scheduler.close()
    bench.queue("b", _job(3))  # queued after close: nobody takes it
    bench.go()
    assert bench.step() == [2]  # 1 ended; 3 did not join
    bench.go()
    thread = bench.scheduler._thread  # the engine thread must end
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert bench.ended == [("a", 1, "Done"), ("b", 2, "Done")]
    assert list(bench.lanes["b"].waiting) == [3]


def test_an_index_past_the_joined_items_fails_every_job_of_the_batch_once() -> None:
    bench = _Bench(_SteppedEngine(max_batch=4, bad_index=True), "a", "b")
    try:
        bench.queue("a", _job(1))
        assert bench.step() == [1]
        bench.queue("b", _job(2))
        bench.go()
        assert bench.step() == [1, 2]
        bench.go()  # the engine yields index 2 of a batch of 2
        bench.until_ended(2)
        assert sorted(bench.ended) == [("a", 1, "internal"), ("b", 2, "internal")]
    finally:
        bench.scheduler.close()
        bench.go()
