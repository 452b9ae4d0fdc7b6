"""Batches across requests: real sidecars whose fake engine batches (``-o max_batch=N``).

The fake engine's ``record`` option writes, for a request synthesized in a batch, the ids
of the batch's requests (``batch``), so each test knows which requests shared a batch.
A batch forms deterministically, without sleeps: a first request hangs (``hang_at=0``)
while the others are queued (a ``ping`` answered after them on each connection proves
it), and cancelling it frees the engine, which takes the waiting ones at once.
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
from harness import Peer, listening_unix, pcm_of, sidecar, spawn, unix_peer

from indextts_client import Client, ProgressEvent, RequestTimeoutError
from indextts_sidecar import protocol
from indextts_sidecar._jobs import Job
from indextts_sidecar._scheduler import Lane, Scheduler
from indextts_sidecar._server import Server
from indextts_sidecar.engines import describe_engine
from indextts_sidecar.engines.fake import FakeEngine, FakeOptions, render_bytes
from indextts_sidecar.protocol.framing import FrameReader
from indextts_sidecar.protocol.streams import FdReceiveStream, FdSendStream

pytestmark = pytest.mark.anyio

TIMEOUT = 60
RATE = 8000
PER_CHAR = 0.01
#: 20 ms chunks at 8 kHz: 320 bytes each.
CHUNK = 320
ENGINE = ["-o", f"sample_rate={RATE}", "-o", f"seconds_per_char={PER_CHAR}"]


def _expected(text: str, **kwargs: Any) -> bytes:
    return render_bytes(text, RATE, seconds_per_char=PER_CHAR, **kwargs)


def _synth(request_id: int, text: str, record: Path | None = None, **options: Any) -> protocol.Synthesize:
    options.setdefault("chunk_seconds", 0.02)
    if record is not None:
        options["record"] = str(record)
    return protocol.Synthesize(id=request_id, text=text, options=options)


def _batch_of(record: Path) -> list[int] | None:
    received: dict[str, Any] = json.loads(record.read_bytes())
    return received.get("batch")


async def _hold_engine(peer: Peer, request_id: int) -> None:
    """Load the model, then occupy the engine with a request that hangs until cancelled."""
    await peer.request(protocol.Load(id=request_id + 1000))
    await peer.send(_synth(request_id, "held", hang_at=0))
    started = await peer.reply()
    assert isinstance(started, protocol.Progress) and started.id == request_id, started


async def _queued(peer: Peer, ping_id: int) -> list[protocol.Reply]:
    """After this, every request sent before on ``peer`` is queued; returns the frames before the pong."""
    await peer.send(protocol.Ping(id=ping_id))
    frames: list[protocol.Reply] = []
    while not isinstance(reply := await peer.reply(), protocol.Pong):
        frames.append(reply)
    return frames


async def _release(peer: Peer, held: int) -> None:
    """Cancel the held request: the engine takes the queued ones."""
    await peer.send(protocol.Cancel(id=held + 2000, target=held))
    frames = await peer.collect({held, held + 2000})
    cancelled, answer = frames[held][-1], frames[held + 2000][-1]
    assert isinstance(cancelled, protocol.Error) and cancelled.code == "cancelled", cancelled
    assert isinstance(answer, protocol.Ok) and answer.info == {"found": True}, answer


async def test_requests_of_several_connections_run_as_one_batch_each_with_its_own_audio(sockdir: Path) -> None:
    texts = {"a": "from the first", "b": "second connection", "c": "third", "d": "and the fourth one"}
    with anyio.fail_after(TIMEOUT):
        async with (
            listening_unix(sockdir, "fake", *ENGINE, "-o", "max_batch=4") as path,
            unix_peer(path, sockdir) as (a, ready),
            unix_peer(path, sockdir) as (b, _),
            unix_peer(path, sockdir) as (c, _),
            unix_peer(path, sockdir) as (d, _),
        ):
            assert ready.max_batch == 4
            peers = {"a": a, "b": b, "c": c, "d": d}
            await _hold_engine(a, 1)
            # Ids repeat across connections: each has its own id space.
            for name, peer in peers.items():
                await peer.send(_synth(5, texts[name], sockdir / f"{name}.json"))
            # One more on b: the batch holds four, so this one runs after it, alone.
            await b.send(_synth(6, "the fifth, alone", sockdir / "b6.json"))
            for peer in peers.values():
                assert await _queued(peer, 99) == []  # queued: nothing for them yet
            await _release(a, 1)
            for name, peer in peers.items():
                frames = await peer.collect({5, 6} if name == "b" else {5})
                assert pcm_of(frames[5]) == _expected(texts[name])
                done = frames[5][-1]
                assert isinstance(done, protocol.Done) and done.samples * 2 == len(_expected(texts[name]))
                batch = _batch_of(sockdir / f"{name}.json")
                assert batch is not None and len(batch) == 4 and batch.count(5) == 4, batch
                if name == "b":
                    assert pcm_of(frames[6]) == _expected("the fifth, alone")
                    assert _batch_of(sockdir / "b6.json") is None  # synthesize(), not a batch of one


async def test_a_request_cancelled_mid_batch_is_answered_at_once_and_the_others_keep_their_bytes(
    tmp_path: Path,
) -> None:
    long_text = "a long request that keeps the batch going for many steps"
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE, "-o", "max_batch=4") as peer:
            await _hold_engine(peer, 1)
            await peer.send(_synth(2, long_text, tmp_path / "2.json", delay=0.02))
            await peer.send(_synth(3, "cancelled in the batch", hang_at=2))
            await peer.send(_synth(4, "short one"))
            assert await _queued(peer, 50) == []
            await _release(peer, 1)
            frames: dict[int, list[protocol.Reply]] = {2: [], 3: [], 4: []}
            ended: list[int] = []
            cancel_sent = False
            while len(ended) < 3:
                reply = await peer.reply()
                if isinstance(reply, protocol.Ok):
                    assert reply.id == 60 and reply.info == {"found": True}
                    continue
                frames[reply.id].append(reply)  # type: ignore[union-attr]
                if protocol.is_terminal(reply):
                    assert reply.id not in ended, f"a second terminal frame: {reply!r}"  # type: ignore[union-attr]
                    ended.append(reply.id)  # type: ignore[union-attr]
                audio3 = [f for f in frames[3] if isinstance(f, protocol.Audio)]
                if len(audio3) == 2 and not cancel_sent:  # request 3 now hangs at its chunk 2
                    await peer.send(protocol.Cancel(id=60, target=3))
                    cancel_sent = True
            # Request 2 has 29 steps of 20 ms left when 3 is cancelled: 3 ends first, at once.
            assert ended.index(3) < ended.index(2), ended
            error = frames[3][-1]
            assert isinstance(error, protocol.Error) and error.code == "cancelled", error
            assert pcm_of(frames[3]) == _expected("cancelled in the batch")[: 2 * CHUNK]
            assert pcm_of(frames[2]) == _expected(long_text)
            assert pcm_of(frames[4]) == _expected("short one")
            assert isinstance(frames[2][-1], protocol.Done) and isinstance(frames[4][-1], protocol.Done)
            assert _batch_of(tmp_path / "2.json") == [2, 3, 4]
            pong = await peer.request(protocol.Ping(id=70))
            assert isinstance(pong[-1], protocol.Pong) and pong[-1].active is None and pong[-1].queue_depth == 0


async def test_a_failing_request_fails_alone_and_an_escaping_exception_fails_those_not_ended(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE, "-o", "max_batch=4") as peer:
            await _hold_engine(peer, 1)
            await peer.send(_synth(2, "fine and long enough", tmp_path / "2.json"))
            await peer.send(_synth(3, "this one fails", fail_at=1, fail_message="item 3 broke"))
            await peer.send(_synth(4, "bad chunk? no, fine"))
            assert await _queued(peer, 50) == []
            await _release(peer, 1)
            frames = await peer.collect({2, 3, 4})
            failed = frames[3][-1]
            assert isinstance(failed, protocol.Error) and failed.code == "engine_error", failed
            assert failed.message == "item 3 broke"
            assert pcm_of(frames[3]) == _expected("this one fails")[:CHUNK]
            assert pcm_of(frames[2]) == _expected("fine and long enough")
            assert pcm_of(frames[4]) == _expected("bad chunk? no, fine")
            assert _batch_of(tmp_path / "2.json") == [2, 3, 4]

            # An exception escaping the generator (fail_raw) fails every request not yet ended.
            await _hold_engine(peer, 11)
            await peer.send(_synth(12, "ab", tmp_path / "12.json"))  # one chunk: ends before the raise
            await peer.send(_synth(13, "raises at chunk three", fail_at=3, fail_raw=True, fail_message="boom"))
            await peer.send(_synth(14, "still going when it raises"))
            assert await _queued(peer, 51) == []
            await _release(peer, 11)
            frames = await peer.collect({12, 13, 14})
            assert isinstance(frames[12][-1], protocol.Done) and pcm_of(frames[12]) == _expected("ab")
            for request_id in (13, 14):
                error = frames[request_id][-1]
                assert isinstance(error, protocol.Error) and error.code == "engine_error", error
                assert error.message == "RuntimeError: boom" and "Traceback" in error.detail["traceback"]
            assert _batch_of(tmp_path / "12.json") == [12, 13, 14]
            # The sidecar serves on.
            done = await peer.request(_synth(15, "after"))
            assert pcm_of(done) == _expected("after")


async def test_requests_of_a_batch_keep_their_own_sample_rate_and_progress_choice(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE, "-o", "max_batch=4") as peer:
            # Alone first (synthesize()): what each must get in the batch too.
            alone = {}
            for request_id, rate in ((2, 16000), (3, None)):
                message = _synth(request_id, f"rate {rate}")
                message.sample_rate = rate
                alone[request_id] = pcm_of(await peer.request(message))
            await _hold_engine(peer, 1)
            resampled = _synth(12, "rate 16000", tmp_path / "12.json")
            resampled.sample_rate = 16000
            await peer.send(resampled)
            quiet = _synth(13, "rate None")
            quiet.progress = False
            await peer.send(quiet)
            assert await _queued(peer, 50) == []
            await _release(peer, 1)
            frames = await peer.collect({12, 13})
            assert pcm_of(frames[12]) == alone[2] and len(alone[2]) == 2 * len(_expected("rate 16000"))
            assert pcm_of(frames[13]) == alone[3] == _expected("rate None")
            assert {f.sample_rate for f in frames[12] if isinstance(f, protocol.Audio)} == {16000}
            assert not [f for f in frames[13] if isinstance(f, protocol.Progress)]
            started = [f for f in frames[12] if isinstance(f, protocol.Progress) and f.stage == "started"]
            assert len(started) == 1
            assert _batch_of(tmp_path / "12.json") == [12, 13]


async def test_a_crash_inside_a_batch_ends_the_process_as_before(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE, "-o", "max_batch=4") as peer:
            await _hold_engine(peer, 1)
            await peer.send(_synth(2, "survives a while", delay=0.01))
            await peer.send(_synth(3, "crashes at two", crash_at=2, exit_code=71))
            assert await _queued(peer, 50) == []
            await _release(peer, 1)
            while (reply := await peer.recv()) is not None:
                assert not protocol.is_terminal(reply), reply  # no request ends: the process does
            assert await peer.process.wait() == 71
            assert "crashing with exit code 71" in peer.stderr()


async def test_each_request_of_a_batch_keeps_its_own_deadline(tmp_path: Path) -> None:
    options = {"sample_rate": RATE, "seconds_per_char": PER_CHAR, "max_batch": 3}
    async with Client("fake", engine_options=options, restart_backoff=0.0) as client:
        with anyio.fail_after(TIMEOUT):
            assert client.info.max_batch == 3
            await client.load()
            async with AsyncExitStack() as stack:
                # The engine is held by a request that hangs at once while the three queue behind
                # it (the pong comes after the sidecar read them); closing it frees the engine,
                # which takes the three as one batch.
                held = await stack.enter_async_context(client.stream("held", hang_at=0, chunk_seconds=0.02))
                async for event in held.events():
                    assert isinstance(event, ProgressEvent), event
                    break
                named = [("first of the others", {"record": str(tmp_path / "r.json")}), ("second of the others", {})]
                others = {name: await stack.enter_async_context(client.request(name, **kw)) for name, kw in named}
                hanging = await stack.enter_async_context(
                    client.request("hangs past its deadline", timeout=2.0, hang_at=3, chunk_seconds=0.02)
                )
                await client.ping()
                await held.aclose()
                with pytest.raises(RequestTimeoutError):
                    await hanging.result()
                for name, request in others.items():
                    assert (await request.result()).samples.tobytes() == _expected(name)
            batch = _batch_of(tmp_path / "r.json")
            assert batch is not None and len(batch) == 3, batch
            health = await client.ping()
            assert health.active is None and health.queue_depth == 0


async def test_ready_and_describe_say_max_batch_and_a_bad_batch_wait_is_refused() -> None:
    assert describe_engine("fake").max_batch == 1  # with its default options
    with anyio.fail_after(TIMEOUT):
        async with spawn("fake", "-o", "max_batch=8") as peer:
            ready = await peer.expect(protocol.Ready)
            assert ready.max_batch == 8
        async with spawn("fake") as peer:
            ready = await peer.expect(protocol.Ready)
            assert ready.max_batch == 1
        async with spawn("fake", "--batch-wait-ms", "-1") as peer:
            error = await peer.expect(protocol.Error)
            assert error.code == "invalid_option" and error.detail["field"] == "--batch-wait-ms", error


async def test_shutdown_during_a_batch_ends_each_of_its_requests_once(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE, "-o", "max_batch=4") as peer:
            await _hold_engine(peer, 1)
            await peer.send(_synth(2, "hangs in the batch", tmp_path / "2.json", hang_at=1))
            await peer.send(_synth(3, "hangs there too", hang_at=2))
            assert await _queued(peer, 50) == []
            await _release(peer, 1)
            frames: dict[int, list[protocol.Reply]] = {2: [], 3: []}
            while sum(isinstance(f, protocol.Audio) for f in frames[3]) < 2:  # both now hang
                reply = await peer.reply()
                frames[reply.id].append(reply)  # type: ignore[union-attr]
            await peer.send(protocol.Shutdown(id=9))
            rest = await peer.collect({2, 3, 9})
            for request_id in (2, 3):
                ending = rest[request_id][-1]
                assert isinstance(ending, protocol.Error) and ending.code == "shutting_down", ending
            assert rest[9] == [protocol.Ok(id=9, info={"exit_code": 0})]
            assert pcm_of(frames[2] + rest[2]) == _expected("hangs in the batch")[:CHUNK]
            assert _batch_of(tmp_path / "2.json") == [2, 3]
            assert await peer.recv() is None
            assert await peer.process.wait() == 0


async def test_a_lone_request_waits_batch_wait_ms_at_most_and_then_runs_alone(tmp_path: Path) -> None:
    options = {"sample_rate": RATE, "seconds_per_char": PER_CHAR, "max_batch": 4}
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", engine_options=options, sidecar_args=["--batch-wait-ms", "50"]) as client:
            await client.load()
            audio = await client.synthesize("nobody else", record=str(tmp_path / "r.json"))
            assert audio.samples.tobytes() == _expected("nobody else")
            assert _batch_of(tmp_path / "r.json") is None  # synthesize(): no company came


async def test_a_lone_request_waiting_for_company_is_cancelled_at_once() -> None:
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *ENGINE, "-o", "max_batch=4", "--batch-wait-ms", "10000") as peer:
            await peer.request(protocol.Load(id=1))
            await peer.send(_synth(2, "waits for company"))
            ping = 100
            while True:  # until the engine thread holds it (active), waiting: no frame of it yet
                ping += 1
                (pong,) = await peer.request(protocol.Ping(id=ping))
                assert isinstance(pong, protocol.Pong)
                if pong.active == 2:
                    break
            began = anyio.current_time()
            await peer.send(protocol.Cancel(id=3, target=2))
            frames = await peer.collect({2, 3})
            # Without the wake-up it would end when the 10 s wait ran out.
            assert anyio.current_time() - began < 5.0
            error = frames[2][-1]
            assert isinstance(error, protocol.Error) and error.code == "cancelled", error
            assert not [f for f in frames[2] if isinstance(f, protocol.Audio)]
            assert frames[3] == [protocol.Ok(id=3, info={"found": True})]


class _Taken(Scheduler):
    """A scheduler that sets ``taken`` once the engine thread has picked a synthesize job."""

    def __init__(self, engine: FakeEngine) -> None:
        super().__init__(engine)
        self.taken = threading.Event()

    def _pick(self) -> Any:
        picked = super()._pick()
        if picked is not None and picked[1].kind == "synthesize":
            self.taken.set()
        return picked


class _EngineThreadFirst(_Taken):
    """The race at ``--batch-wait-ms 0``, made certain: the loop thread queues a burst's first
    request and waits until the engine thread has taken it, then queues the rest."""

    def __init__(self, engine: FakeEngine) -> None:
        super().__init__(engine)
        self.first = True

    def enqueue(self, lane: Lane, job: Job, limit: int) -> int | None:
        depth = super().enqueue(lane, job, limit)
        if job.kind == "synthesize" and self.first:
            self.first = False
            assert self.taken.wait(TIMEOUT)  # the engine thread holds it; the others are not queued yet
        return depth


class _EngineThreadAfterTwo(_Taken):
    """The same race one request later: the engine thread takes a burst's first two requests
    (a batch already, but not a full one) before the loop thread has queued the rest."""

    def __init__(self, engine: FakeEngine) -> None:
        super().__init__(engine)
        self.two = threading.Event()
        self.queued = 0

    def _take(self) -> Any:
        if self.queued:
            assert self.two.wait(TIMEOUT)  # the burst's first two are queued before it takes any
        return super()._take()

    def enqueue(self, lane: Lane, job: Job, limit: int) -> int | None:
        if job.kind == "synthesize":
            self.queued += 1  # before its token can wake the engine thread
        depth = super().enqueue(lane, job, limit)
        if job.kind == "synthesize" and self.queued == 2:
            self.two.set()
            assert self.taken.wait(TIMEOUT)  # the engine thread holds two; the rest are not queued yet
        return depth


@pytest.mark.parametrize("scheduler_class", [_EngineThreadFirst, _EngineThreadAfterTwo])
async def test_a_burst_written_at_once_runs_as_one_batch_without_batch_wait(
    tmp_path: Path, scheduler_class: type[Scheduler]
) -> None:
    """With ``--batch-wait-ms 0`` the first request of a burst does not start alone, nor its first
    two as a batch of two: the engine thread lets the event loop go round (it queues the rest of
    the burst) before it starts a batch that is not full."""
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    engine = FakeEngine(FakeOptions(sample_rate=RATE, seconds_per_char=PER_CHAR, max_batch=4))
    scheduler = scheduler_class(engine)  # type: ignore[call-arg]
    server = Server(engine, scheduler=scheduler)
    texts = {2: "the first of four", 3: "second", 4: "third one", 5: "and the last"}
    try:
        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg, FdReceiveStream(replies_r) as replies:
                tg.start_soon(server.serve, FdReceiveStream(requests_r), FdSendStream(replies_w))
                reader = FrameReader(replies)

                async def until_terminal(ids: set[int]) -> dict[int, list[protocol.Reply]]:
                    frames: dict[int, list[protocol.Reply]] = {i: [] for i in ids}
                    ended: set[int] = set()
                    while ended != ids:
                        body = await reader.receive()
                        assert body is not None, frames
                        reply = protocol.decode_reply(body)
                        if isinstance(reply, protocol.Ready):
                            continue
                        frames[reply.id].append(reply)  # type: ignore[union-attr]
                        if protocol.is_terminal(reply):
                            ended.add(reply.id)  # type: ignore[union-attr]
                    return frames

                os.write(requests_w, protocol.frame(protocol.Load(id=1)))
                assert isinstance((await until_terminal({1}))[1][-1], protocol.Ok)
                burst = b"".join(protocol.frame(_synth(i, text, tmp_path / f"{i}.json")) for i, text in texts.items())
                os.write(requests_w, burst)  # one write: the four arrive together
                frames = await until_terminal(set(texts))
                for i, text in texts.items():
                    assert isinstance(frames[i][-1], protocol.Done), frames[i][-1]
                    assert pcm_of(frames[i]) == _expected(text)
                    assert _batch_of(tmp_path / f"{i}.json") == [2, 3, 4, 5]
                # A lone request still runs by itself (synthesize(), no batch of one).
                os.write(requests_w, protocol.frame(_synth(6, "alone", tmp_path / "6.json")))
                frames = await until_terminal({6})
                assert pcm_of(frames[6]) == _expected("alone")
                assert _batch_of(tmp_path / "6.json") is None
                os.close(requests_w)  # end of input: the server ends
                requests_w = -1
    finally:
        scheduler.close()
        for fd in (requests_w, replies_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
