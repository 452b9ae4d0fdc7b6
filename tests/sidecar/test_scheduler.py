"""The Scheduler owns each connection's queue: enqueue, cancel, stop, round robin; no process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from indextts_sidecar import protocol
from indextts_sidecar._jobs import Job
from indextts_sidecar._scheduler import Lane, Scheduler
from indextts_sidecar.engines.fake import FakeEngine, FakeOptions

TIMEOUT = 30


class _Output:
    """Records the terminal frames the scheduler (or its engine thread) hands a connection."""

    def __init__(self, name: str, ended: list[tuple[str, int, str]], all_done: threading.Event, total: int) -> None:
        self.name = name
        self.frame_bytes = 1 << 20
        self.frame_words = self.done_words = 1000
        self.sent: list[protocol.Reply] = []
        self._ended = ended
        self._all_done = all_done
        self._total = total

    def finish(self, job: Job, message: protocol.Reply) -> None:
        if job.finished:
            return
        job.finished = True
        code = message.code if isinstance(message, protocol.Error) else type(message).__name__
        self._ended.append((self.name, job.id, code))
        if len(self._ended) == self._total:
            self._all_done.set()

    def send(self, message: protocol.Reply) -> None:
        self.sent.append(message)

    def post(self, fn: Any, *args: Any) -> None:
        fn(*args)


@contextmanager
def _scheduler() -> Iterator[Scheduler]:
    scheduler = Scheduler(FakeEngine(FakeOptions()))
    try:
        yield scheduler
    finally:
        scheduler.close()


def _lanes(
    scheduler: Scheduler, total: int, *names: str
) -> tuple[list[tuple[str, int, str]], threading.Event, list[Lane]]:
    ended: list[tuple[str, int, str]] = []
    done = threading.Event()
    lanes = [scheduler.attach(_Output(name, ended, done, total)) for name in names]  # type: ignore[arg-type]
    return ended, done, lanes


def test_jobs_run_round_robin_over_the_connections_in_fifo_order_each() -> None:
    with _scheduler() as scheduler:
        ended, done, (a, b) = _lanes(scheduler, 5, "a", "b")
        # Held, the lock keeps the engine thread from picking until all five are queued.
        with scheduler.lock:
            for job_id in (1, 2, 3):
                assert scheduler.enqueue(a, Job(job_id, "unload"), limit=8) is None
            for job_id in (1, 2):
                assert scheduler.enqueue(b, Job(job_id, "unload"), limit=8) is None
            assert (a.depth, b.depth) == (3, 2)
        assert done.wait(TIMEOUT)
        assert ended == [("a", 1, "Ok"), ("b", 1, "Ok"), ("a", 2, "Ok"), ("b", 2, "Ok"), ("a", 3, "Ok")]
        assert (a.depth, b.depth, a.running, b.running) == (0, 0, None, None)


def test_a_full_queue_refuses_with_its_depth() -> None:
    with _scheduler() as scheduler:
        _, _, (lane,) = _lanes(scheduler, 99, "a")
        with scheduler.lock:
            assert scheduler.enqueue(lane, Job(1, "unload"), limit=2) is None
            assert scheduler.enqueue(lane, Job(2, "unload"), limit=2) is None
            assert scheduler.enqueue(lane, Job(3, "unload"), limit=2) == 2
            assert list(lane.waiting) == [1, 2]
            scheduler.stop_all(lane)


def test_cancel_ends_a_waiting_job_at_once_and_finds_no_unknown_id() -> None:
    with _scheduler() as scheduler:
        ended, _, (a, b) = _lanes(scheduler, 99, "a", "b")
        with scheduler.lock:
            scheduler.enqueue(a, Job(1, "unload"), limit=8)
            scheduler.enqueue(b, Job(1, "unload"), limit=8)
            assert scheduler.cancel(a, 1) is True
            assert ended == [("a", 1, "cancelled")]
            assert scheduler.cancel(a, 1) is False  # gone already
            assert scheduler.cancel(a, 99) is False
            reason = protocol.Error(code="internal", id=1, message="a bug")
            assert scheduler.cancel(b, 1, reason=reason) is True
            assert ended == [("a", 1, "cancelled"), ("b", 1, "internal")]
            assert (a.depth, b.depth) == (0, 0)


def test_stop_all_ends_one_connections_waiting_jobs_only() -> None:
    with _scheduler() as scheduler:
        ended, _, (a, b) = _lanes(scheduler, 99, "a", "b")
        with scheduler.lock:
            for job_id in (4, 5):
                scheduler.enqueue(a, Job(job_id, "synthesize"), limit=8)
            scheduler.enqueue(b, Job(6, "synthesize"), limit=8)
            scheduler.enqueue(b, Job(7, "load"), limit=8)
            waiting = [(output.name, job.id) for output, job in scheduler.waiting_jobs("synthesize")]  # type: ignore[attr-defined]
            assert waiting == [("a", 4), ("a", 5), ("b", 6)]
            assert scheduler.stop_all(a) is None  # nothing ran: nothing to wait for
            assert ended == [("a", 4, "shutting_down"), ("a", 5, "shutting_down")]
            assert list(b.waiting) == [6, 7]
            assert scheduler.until_idle(a) is None
            scheduler.stop_all(b)


class _BatchingEngine(FakeEngine):
    """Loaded, batching up to three; records what it ran: a batch's ids, or one id alone."""

    def __init__(self) -> None:
        super().__init__(FakeOptions(sample_rate=8000))
        self._loaded = True
        self.ran: list[tuple[int, ...]] = []

    @property
    def max_batch(self) -> int:
        return 3

    def synthesize(self, request: Any, progress: Any, cancelled: Any) -> Iterator[Any]:
        self.ran.append((request.id,))
        yield b"\x01\x00"

    def synthesize_batch(self, items: Any, join: Any = None) -> Iterator[tuple[int, Any]]:
        self.ran.append(tuple(item.request.id for item in items))
        for index in range(len(items)):
            yield index, b"\x01\x00"


class _FrameOutput(_Output):
    """An output that also takes the running jobs' frames (and drops them)."""

    def audio(self, job: Job, seq: int, rate: int, pcm: memoryview, words: Any = ()) -> bool:
        return True

    def progress(self, job: Job, stage: str, fraction: Any, message: str) -> None:
        pass


def test_a_batch_takes_synthesize_jobs_round_robin_from_the_heads_of_the_queues() -> None:
    from indextts_sidecar.engines import SynthesisRequest
    from indextts_sidecar.engines.fake import FakeRequestOptions

    def job(job_id: int, kind: str = "synthesize") -> Job:
        request = SynthesisRequest(id=job_id, text="x", voice=None, emotion=None, options=FakeRequestOptions())
        return Job(job_id, kind, request if kind == "synthesize" else None)

    engine = _BatchingEngine()
    scheduler = Scheduler(engine)
    try:
        ended: list[tuple[str, int, str]] = []
        done = threading.Event()
        a, b, c = (scheduler.attach(_FrameOutput(name, ended, done, 7)) for name in "abc")  # type: ignore[arg-type]
        with scheduler.lock:
            for lane, jobs in ((a, [job(1), job(2), job(3)]), (b, [job(4, "unload"), job(5)]), (c, [job(6), job(7)])):
                for each in jobs:
                    assert scheduler.enqueue(lane, each, limit=8) is None
        assert done.wait(TIMEOUT)
        # a's head, then round robin: b's head is an unload, so b gives nothing to the batch (its
        # synthesize may not pass its unload); c's head, then a's next.  Then b's unload alone;
        # the next, c's 7, finds the model unloaded: it runs alone and loads it; then a's 3 and
        # b's 5 together.
        assert engine.ran == [(1, 6, 2), (7,), (3, 5)]
        codes = {(name, job_id): code for name, job_id, code in ended}
        assert len(ended) == len(codes) == 7  # one terminal each
        assert codes == {**{key: "Done" for key in codes}, ("b", 4): "Ok"}
        assert ended.index(("b", 4, "Ok")) < ended.index(("b", 5, "Done"))
    finally:
        scheduler.close()
