"""Continuous batching: real sidecars whose fake engine joins batches (``-o join_batches=true``).

A request sent while a batch runs joins it at its next step.  Each test sends the joiner
after the first request's first audio has arrived (a real happened-before, no sleep), and
the first request runs many steps of ``delay`` after that (over a second in all), so the
joiner is queued long before the batch could end.  The fake engine's ``record`` names, for
each request, every request it shared a step with (``batch``), so the tests see who joined.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from harness import Peer, listening_unix, pcm_of, sidecar, unix_peer

from indextts_client import Client, RequestTimeoutError
from indextts_sidecar import protocol
from indextts_sidecar.engines.fake import render_bytes

pytestmark = pytest.mark.anyio

TIMEOUT = 60
RATE = 8000
PER_CHAR = 0.01
#: 20 ms chunks at 8 kHz: 320 bytes each, two characters.
CHUNK = 320
JOINING = ["-o", f"sample_rate={RATE}", "-o", f"seconds_per_char={PER_CHAR}", "-o", "join_batches=true"]
#: 36 chunks of 40 ms each: about 1.4 s of steps after its first audio.
LONG = "the first request runs for many steps, so that the others join it midway"
STEP = 0.04


def _expected(text: str) -> bytes:
    return render_bytes(text, RATE, seconds_per_char=PER_CHAR)


def _synth(request_id: int, text: str, record: Path | None = None, **options: Any) -> protocol.Synthesize:
    options.setdefault("chunk_seconds", 0.02)
    options.setdefault("delay", STEP)
    if record is not None:
        options["record"] = str(record)
    return protocol.Synthesize(id=request_id, text=text, options=options)


def _voiced(request: protocol.Synthesize, voice: str) -> protocol.Synthesize:
    return msgspec.structs.replace(request, voice=voice)


def _batch_of(record: Path) -> list[int] | None:
    received: dict[str, Any] = json.loads(record.read_bytes())
    return received.get("batch")


def _joined(record: Path) -> int | None:
    """How many steps the batch had run when the request joined it; None: it did not join."""
    received: dict[str, Any] = json.loads(record.read_bytes())
    return received.get("joined")


class _Log:
    """Every frame of one connection in arrival order, and per request id."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.order: list[protocol.Reply] = []
        self.frames: dict[int, list[protocol.Reply]] = {}
        self.ended: list[int] = []

    async def next(self) -> protocol.Reply:
        reply = await self.peer.reply()
        self.order.append(reply)
        request_id = getattr(reply, "id", None)
        assert request_id is not None, reply
        self.frames.setdefault(request_id, []).append(reply)
        if protocol.is_terminal(reply):
            assert request_id not in self.ended, f"a second terminal frame: {reply!r}"
            self.ended.append(request_id)
        return reply

    async def until_audio(self, request_id: int, count: int = 1) -> None:
        while self.audio_count(request_id) < count:
            await self.next()

    async def until_ended(self, *ids: int) -> None:
        while not set(ids) <= set(self.ended):
            await self.next()

    def audio_count(self, request_id: int) -> int:
        return sum(isinstance(f, protocol.Audio) for f in self.frames.get(request_id, []))

    def first_audio(self, request_id: int) -> int:
        return next(i for i, f in enumerate(self.order) if isinstance(f, protocol.Audio) and f.id == request_id)

    def terminal(self, request_id: int) -> int:
        return next(i for i, f in enumerate(self.order) if protocol.is_terminal(f) and f.id == request_id)  # type: ignore[union-attr]

    def last(self, request_id: int) -> protocol.Reply:
        return self.frames[request_id][-1]


async def _loaded(peer: Peer) -> None:
    (ok,) = [f for f in await peer.request(protocol.Load(id=999)) if not isinstance(f, protocol.Progress)]
    assert isinstance(ok, protocol.Ok), ok


@asynccontextmanager
async def _joining(max_batch: int) -> AsyncIterator[tuple[Peer, _Log]]:
    """A sidecar whose fake engine joins batches of up to ``max_batch``, loaded, and a log of its frames."""
    async with sidecar("fake", *JOINING, "-o", f"max_batch={max_batch}") as peer:
        await _loaded(peer)
        yield peer, _Log(peer)


async def test_a_request_sent_while_another_runs_joins_it_and_both_keep_their_bytes(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with _joining(max_batch=4) as (peer, log):
            await peer.send(_synth(1, LONG, tmp_path / "1.json"))
            await log.until_audio(1)
            assert _batch_of(tmp_path / "1.json") == [1]  # a batch of one so far
            await peer.send(_synth(2, "the joiner", tmp_path / "2.json"))
            await log.until_ended(1, 2)
            assert isinstance(log.last(1), protocol.Done) and isinstance(log.last(2), protocol.Done)
            assert pcm_of(log.frames[1]) == _expected(LONG)
            assert pcm_of(log.frames[2]) == _expected("the joiner")
            # It did not wait for the first to end: its audio came while the first ran, and it
            # ended first (5 steps against the first's 35 left).
            assert log.first_audio(2) < log.terminal(2) < log.terminal(1)
            assert _batch_of(tmp_path / "1.json") == [1, 2]
            assert _batch_of(tmp_path / "2.json") == [1, 2]
            # It joined after the first's first step (at least), while 34 were left.
            joined = _joined(tmp_path / "2.json")
            assert joined is not None and 1 <= joined < 36 and _joined(tmp_path / "1.json") is None
            # Once the batch has ended, a lone request runs as a batch of one.
            alone = await peer.request(_synth(3, "alone", tmp_path / "3.json"))
            assert pcm_of(alone) == _expected("alone") and isinstance(alone[-1], protocol.Done)
            assert _batch_of(tmp_path / "3.json") == [3]
            (pong,) = await peer.request(protocol.Ping(id=50))
            assert isinstance(pong, protocol.Pong) and pong.active is None and pong.queue_depth == 0


async def test_a_full_batch_takes_a_joiner_only_once_one_of_its_requests_ended(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with _joining(max_batch=2) as (peer, log):
            await peer.send(_synth(1, LONG, tmp_path / "1.json"))
            await log.until_audio(1)
            # Both at once: the batch has room for one.
            await peer.send_raw(
                protocol.frame(_synth(2, "three steps", tmp_path / "2.json"))
                + protocol.frame(_synth(3, "the third", tmp_path / "3.json"))
            )
            await log.until_ended(1, 2, 3)
            for request_id, text in ((1, LONG), (2, "three steps"), (3, "the third")):
                assert isinstance(log.last(request_id), protocol.Done), log.last(request_id)
                assert pcm_of(log.frames[request_id]) == _expected(text)
            assert log.terminal(2) < log.first_audio(3) < log.terminal(1)
            assert _batch_of(tmp_path / "1.json") == [1, 2, 3]
            assert _batch_of(tmp_path / "2.json") == [1, 2]
            assert _batch_of(tmp_path / "3.json") == [1, 3]
            # 3 joined once 2 (six steps) had ended.
            joined = {request_id: _joined(tmp_path / f"{request_id}.json") for request_id in (2, 3)}
            assert joined[2] is not None and joined[3] is not None and joined[3] >= joined[2] + 6, joined


async def test_a_joiner_keeps_its_own_sample_rate_and_progress_choice(tmp_path: Path) -> None:
    def joiner(request_id: int) -> protocol.Synthesize:
        message = _synth(request_id, "resampled joiner", tmp_path / f"{request_id}.json")
        message.sample_rate = 16000
        message.progress = False
        return message

    with anyio.fail_after(TIMEOUT):
        async with _joining(max_batch=4) as (peer, log):
            alone = await peer.request(joiner(1))
            assert _batch_of(tmp_path / "1.json") == [1]
            await peer.send(_synth(2, LONG))
            await log.until_audio(2)
            await peer.send(joiner(3))
            await log.until_ended(2, 3)
            assert _joined(tmp_path / "3.json") is not None and _batch_of(tmp_path / "3.json") == [2, 3]
            assert pcm_of(log.frames[3]) == pcm_of(alone)
            assert len(pcm_of(alone)) == 2 * len(_expected("resampled joiner"))
            assert {f.sample_rate for f in log.frames[3] if isinstance(f, protocol.Audio)} == {16000}
            assert not [f for f in log.frames[3] if isinstance(f, protocol.Progress)]
            assert [f.stage for f in log.frames[2] if isinstance(f, protocol.Progress)].count("started") == 1
            assert pcm_of(log.frames[2]) == _expected(LONG)


async def test_a_job_of_another_kind_waiting_stops_the_joining_until_it_has_run(sockdir: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with (
            listening_unix(sockdir, "fake", *JOINING, "-o", "max_batch=4") as path,
            unix_peer(path, sockdir) as (a, _),
            unix_peer(path, sockdir) as (b, _),
        ):
            await _loaded(a)
            log = _Log(a)
            await a.send(_synth(1, LONG, sockdir / "1.json"))
            await log.until_audio(1)
            await b.send(protocol.Load(id=7))  # another kind of job, at the head of b's queue
            await b.send(protocol.Ping(id=8))
            # The pong comes after the load is queued; nothing of the load before it.
            assert isinstance(await b.reply(), protocol.Pong)
            await a.send(_synth(2, "not a joiner", sockdir / "2.json"))
            await log.until_ended(1, 2)
            loaded = [f for f in await b.until_terminal(7) if not isinstance(f, protocol.Progress)]
            assert len(loaded) == 1 and isinstance(loaded[0], protocol.Ok), loaded
            assert pcm_of(log.frames[1]) == _expected(LONG) and pcm_of(log.frames[2]) == _expected("not a joiner")
            # The batch took no one: it drained, the load ran, then the next synthesize.
            assert _batch_of(sockdir / "1.json") == [1]
            assert _batch_of(sockdir / "2.json") == [2]
            assert log.terminal(1) < log.first_audio(2)


async def test_a_cancelled_joiner_and_a_cancelled_first_request_end_alone(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with _joining(max_batch=4) as (peer, log):
            # The joiner is cancelled: answered at once, the first goes on.
            await peer.send(_synth(1, LONG, tmp_path / "1.json"))
            await log.until_audio(1)
            await peer.send(_synth(2, LONG + " too"))
            await log.until_audio(2, 2)
            await peer.send(protocol.Cancel(id=3, target=2))
            await log.until_ended(1, 2, 3)
            error = log.last(2)
            assert isinstance(error, protocol.Error) and error.code == "cancelled", error
            assert log.last(3) == protocol.Ok(id=3, info={"found": True})
            assert log.terminal(2) < log.terminal(1)
            cut = pcm_of(log.frames[2])
            assert 2 * CHUNK <= len(cut) < len(_expected(LONG + " too")) and _expected(LONG + " too").startswith(cut)
            assert pcm_of(log.frames[1]) == _expected(LONG) and isinstance(log.last(1), protocol.Done)
            assert _batch_of(tmp_path / "1.json") == [1, 2]

            # The first is cancelled: the joiner goes on to its end.
            await peer.send(_synth(11, LONG, tmp_path / "11.json"))
            await log.until_audio(11)
            await peer.send(_synth(12, "the joiner outlives it", tmp_path / "12.json"))
            await log.until_audio(12)
            await peer.send(protocol.Cancel(id=13, target=11))
            await log.until_ended(11, 12, 13)
            error = log.last(11)
            assert isinstance(error, protocol.Error) and error.code == "cancelled", error
            assert _expected(LONG).startswith(pcm_of(log.frames[11]))
            assert pcm_of(log.frames[12]) == _expected("the joiner outlives it")
            assert isinstance(log.last(12), protocol.Done)
            assert _batch_of(tmp_path / "12.json") == [11, 12]
            (pong,) = await peer.request(protocol.Ping(id=50))
            assert isinstance(pong, protocol.Pong) and pong.active is None and pong.queue_depth == 0


async def test_a_failing_joiner_fails_alone_and_a_raising_one_fails_the_whole_batch(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with _joining(max_batch=4) as (peer, log):
            await peer.send(_synth(1, LONG, tmp_path / "1.json"))
            await log.until_audio(1)
            await peer.send(_synth(2, "fails at its second chunk", fail_at=1, fail_message="joiner broke"))
            await log.until_ended(1, 2)
            failed = log.last(2)
            assert isinstance(failed, protocol.Error) and failed.code == "engine_error", failed
            assert failed.message == "joiner broke"
            assert pcm_of(log.frames[2]) == _expected("fails at its second chunk")[:CHUNK]
            assert pcm_of(log.frames[1]) == _expected(LONG) and isinstance(log.last(1), protocol.Done)
            assert _batch_of(tmp_path / "1.json") == [1, 2]

            # An exception escaping the engine (fail_raw) while a joiner's step runs fails the
            # first request and every joiner not yet ended.
            await peer.send(_synth(11, LONG))
            await log.until_audio(11)
            await peer.send_raw(
                protocol.frame(_synth(12, "a joiner that is still going"))
                + protocol.frame(_synth(13, "raises", fail_at=2, fail_raw=True, fail_message="boom"))
            )
            await log.until_ended(11, 12, 13)
            for request_id in (11, 12, 13):
                error = log.last(request_id)
                assert isinstance(error, protocol.Error) and error.code == "engine_error", error
                assert error.message == "RuntimeError: boom" and "Traceback" in error.detail["traceback"]
            assert log.audio_count(13) == 2
            # The sidecar serves on.
            done = await peer.request(_synth(20, "after"))
            assert pcm_of(done) == _expected("after")


async def test_a_joiner_keeps_its_own_deadline_and_the_first_its_bytes(tmp_path: Path) -> None:
    options = {"sample_rate": RATE, "seconds_per_char": PER_CHAR, "max_batch": 4, "join_batches": True}
    async with Client("fake", engine_options=options, restart_backoff=0.0) as client:
        with anyio.fail_after(TIMEOUT):
            await client.load()
            first = bytearray()
            outcome: dict[str, Any] = {}

            async def joiner() -> None:
                try:
                    await client.synthesize("hangs past its deadline", timeout=1.0, hang_at=1, chunk_seconds=0.02)
                except RequestTimeoutError as exc:
                    outcome["joiner"] = exc

            async with anyio.create_task_group() as tg:
                record = str(tmp_path / "1.json")
                async with client.stream(LONG, chunk_seconds=0.02, delay=STEP, record=record) as chunks:
                    async for chunk in chunks:
                        if not first:
                            tg.start_soon(joiner)  # after the first's first audio
                        first += chunk.samples.tobytes()
            assert isinstance(outcome["joiner"], RequestTimeoutError)
            assert bytes(first) == _expected(LONG)
            batch = _batch_of(tmp_path / "1.json")
            assert batch is not None and len(batch) == 2, batch  # the joiner shared its steps
            health = await client.ping()
            assert health.active is None and health.queue_depth == 0


async def test_shutdown_while_a_batch_with_a_joiner_runs_ends_each_request_once(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with _joining(max_batch=4) as (peer, log):
            await peer.send(_synth(1, "hangs at its third chunk", tmp_path / "1.json", hang_at=2))
            await log.until_audio(1)
            await peer.send(_synth(2, "joins, then hangs", hang_at=1))
            await log.until_audio(2)  # it joined; both hang now, or soon
            await peer.send(protocol.Shutdown(id=9))
            await log.until_ended(1, 2, 9)
            for request_id in (1, 2):
                ending = log.last(request_id)
                assert isinstance(ending, protocol.Error) and ending.code == "shutting_down", ending
            assert log.last(9) == protocol.Ok(id=9, info={"exit_code": 0})
            assert pcm_of(log.frames[2]) == _expected("joins, then hangs")[:CHUNK]
            assert _batch_of(tmp_path / "1.json") == [1, 2]
            assert await peer.recv() is None
            assert await peer.process.wait() == 0


async def test_each_request_of_a_joined_batch_gets_its_own_facts_in_done(tmp_path: Path) -> None:
    """done.facts (the engine's request_facts()) reach a batch of one and each request of a batch."""
    alice, bob = tmp_path / "alice.wav", tmp_path / "bob.wav"
    alice.write_bytes(b"a voice the fake engine never reads")
    bob.write_bytes(b"another")
    with anyio.fail_after(TIMEOUT):
        async with _joining(max_batch=4) as (peer, log):
            await peer.send(_voiced(_synth(1, "alone"), str(alice)))
            await log.until_ended(1)
            lone = log.last(1)
            assert isinstance(lone, protocol.Done), lone
            assert lone.facts["voice_cache"] == "miss" and "render" in lone.facts["stages"]
            await peer.send(_voiced(_synth(2, LONG, tmp_path / "2.json"), str(alice)))
            await log.until_audio(2)
            await peer.send(_voiced(_synth(3, "joins", tmp_path / "3.json"), str(bob)))
            await log.until_ended(2, 3)
            assert _joined(tmp_path / "3.json") is not None  # it did join the running batch
            first, joiner = log.last(2), log.last(3)
            assert isinstance(first, protocol.Done) and isinstance(joiner, protocol.Done), (first, joiner)
            assert first.facts["voice_cache"] == "hit" and joiner.facts["voice_cache"] == "miss"
