"""Requests over a real fake-engine sidecar: results, streaming, progress, deadlines, cancellation."""

from __future__ import annotations

import io
import json
import time
import wave
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from client_support import RATE, expected, fake_client

from indextts_client import (
    Audio,
    AudioChunk,
    BusyError,
    EmotionText,
    EmotionVector,
    EngineError,
    InvalidRequestError,
    LoadFailedError,
    LoadInfo,
    ProgressEvent,
    RequestCancelledError,
    RequestTimeoutError,
    SidecarError,
)
from indextts_sidecar._resample import make_resampler

pytestmark = pytest.mark.anyio


async def test_synthesize_returns_exact_audio(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            audio = await client.synthesize("Hello, world")
    assert isinstance(audio, Audio)
    want = expected("Hello, world")
    assert audio.samples.tobytes() == want
    assert audio.samples.dtype == np.dtype("<i2")
    assert audio.samples.flags.writeable
    assert len(audio) == len(want) // 2 == 12 * RATE // 100
    assert audio.sample_rate == RATE
    assert audio.duration == pytest.approx(0.12)
    assert audio.request_id >= 1
    assert {"queued", "synthesis", "total"} <= set(audio.timings)

    floats = audio.as_float32()
    assert floats.dtype == np.float32
    assert floats.min() >= -1.0 and floats.max() < 1.0
    np.testing.assert_array_equal(floats * 32768, audio.samples.astype(np.float32))

    path = tmp_path / "out.wav"
    audio.to_wav(path)
    buffer = io.BytesIO()
    audio.to_wav(buffer)
    for source in (str(path), io.BytesIO(buffer.getvalue())):
        with wave.open(source, "rb") as wav:
            assert wav.getnchannels() == 1
            assert wav.getsampwidth() == 2
            assert wav.getframerate() == RATE
            assert wav.readframes(wav.getnframes()) == want


async def test_long_audio_in_many_frames_is_assembled_exactly() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            # 20 s at 8 kHz in 0.1 s chunks: 200 audio frames.
            audio = await client.synthesize("many frames", seconds=20, chunk_seconds=0.1)
    assert audio.samples.tobytes() == expected("many frames", seconds=20)
    assert audio.samples.flags.writeable


async def test_requested_sample_rate_is_honoured() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            audio = await client.synthesize("resample me", sample_rate=2 * RATE, chunk_seconds=0.03)
    native = np.frombuffer(expected("resample me"), dtype="<i2")
    assert audio.sample_rate == 2 * RATE
    assert len(audio) == 2 * len(native)
    # Streamed through the sidecar's band-limited converter, exactly as the whole signal converts.
    whole = make_resampler(RATE, 2 * RATE)
    assert audio.samples.tobytes() == whole.feed(native.tobytes()) + whole.flush()


async def test_stream_yields_chunks_in_order() -> None:
    text = "streaming text"
    with anyio.fail_after(20):
        async with fake_client() as client, client.stream(text, chunk_seconds=0.03) as chunks:
            received = [chunk async for chunk in chunks]
            assert chunks.finished
            assert {"synthesis", "total"} <= set(chunks.timings)
    assert [chunk.seq for chunk in received] == list(range(len(received)))
    assert len(received) == 5  # 140 ms in 30 ms chunks
    offsets = [chunk.offset_samples for chunk in received]
    assert offsets == [sum(len(c) for c in received[:i]) for i in range(len(received))]
    assert all(isinstance(chunk, AudioChunk) and chunk.sample_rate == RATE for chunk in received)
    assert all(not chunk.samples.flags.writeable for chunk in received)
    assert b"".join(chunk.samples.tobytes() for chunk in received) == expected(text)
    with pytest.raises(RuntimeError, match="keeps no audio"):
        await chunks.result()


async def test_stream_and_request_tell_the_engine_they_stream_and_synthesize_does_not(tmp_path: Path) -> None:
    def received(name: str) -> Any:
        return json.loads((tmp_path / name).read_bytes())["stream"]

    with anyio.fail_after(20):
        async with fake_client() as client:
            async with client.stream("streamed", record=str(tmp_path / "s.json")) as chunks:
                assert b"".join([chunk.samples.tobytes() async for chunk in chunks]) == expected("streamed")
            async with client.request("requested", record=str(tmp_path / "r.json")) as req:
                assert (await req.result()).samples.tobytes() == expected("requested")
            whole = await client.synthesize("whole", record=str(tmp_path / "w.json"))
            assert whole.samples.tobytes() == expected("whole")
    assert (received("s.json"), received("r.json"), received("w.json")) == (True, True, False)


async def test_a_bare_async_for_is_refused_before_anything_is_sent() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            stream = client.stream("plain", chunk_seconds=0.02)
            with pytest.raises(RuntimeError, match=r"inside 'async with client\.stream\(\.\.\.\) as chunks:'"):
                async for _chunk in stream:
                    pass
            request = client.request("plain")
            with pytest.raises(RuntimeError, match="leaving the loop early cancels the request"):
                request.events()
            assert stream.request_id is None and request.request_id is None  # nothing was sent
            assert (await client.ping()).queue_depth == 0
            # An explicit start() makes the caller responsible for aclose(): then iteration is allowed.
            await stream.start()
            try:
                data = b"".join([chunk.samples.tobytes() async for chunk in stream])
            finally:
                await stream.aclose()
    assert data == expected("plain")


async def test_request_events_then_result() -> None:
    text = "events and result"
    with anyio.fail_after(20):
        async with fake_client() as client:
            async with client.request(text, chunk_seconds=0.05) as req:
                assert req.request_id is not None
                events = [event async for event in req.events()]
                audio = await req.result()
            assert await req.result() is audio  # idempotent once done
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    assert {e.request_id for e in progress} == {req.request_id}
    # "started" the moment the engine took it (the load, if any, follows), then one per chunk.
    assert [e.stage for e in progress if e.stage != "load"] == ["started"] + ["synthesize"] * len(chunks)
    fractions = [e.fraction for e in progress if e.stage == "synthesize"]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert b"".join(c.samples.tobytes() for c in chunks) == expected(text)
    assert audio.samples.tobytes() == expected(text)
    assert audio.request_id == req.request_id


async def test_progress_callbacks_sync_and_async() -> None:
    seen_sync: list[ProgressEvent] = []
    seen_async: list[ProgressEvent] = []

    async def async_callback(event: ProgressEvent) -> None:
        await anyio.lowlevel.checkpoint()
        seen_async.append(event)

    with anyio.fail_after(20):
        async with fake_client(engine_options={"load_delay": 0.02}) as client:
            first = await client.synthesize("abc", on_progress=seen_sync.append, chunk_seconds=0.01)
            second = await client.synthesize("abcd", on_progress=async_callback, chunk_seconds=0.01)
    # The first request loaded the model: its load progress came to it.
    assert [e.stage for e in seen_sync if e.stage != "synthesize"] == ["started"] + ["load"] * 11
    assert [e.fraction for e in seen_sync if e.stage == "synthesize"] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert {e.request_id for e in seen_sync} == {first.request_id}
    assert [e.stage for e in seen_async] == ["started"] + ["synthesize"] * 4
    assert {e.request_id for e in seen_async} == {second.request_id}


async def test_emotion_values() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            for emotion in (
                EmotionVector(happy=0.8, calm=0.2),
                {"happy": 0.5, "sad": 0.1, "alpha": 0.9},
                {"kind": "text", "text": "cheerful"},
                EmotionText(),
            ):
                audio = await client.synthesize("emo", emotion=emotion)
                assert audio.samples.tobytes() == expected("emo")
            with pytest.raises(InvalidRequestError) as caught:
                await client.synthesize("emo", emotion={"joyful": 1.0})
            assert caught.value.code == "invalid_option"
            with pytest.raises(TypeError):
                await client.synthesize("emo", emotion=0.5)  # type: ignore[arg-type]


async def test_ping_is_answered_while_a_synthesis_runs() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            health = await client.ping()
            assert not health.loaded and health.active is None and health.queue_depth == 0
            assert health.memory["rss"] > 0 and health.uptime >= 0
            async with client.stream("long", hang_at=1, chunk_seconds=0.01) as chunks:
                first = await chunks.__anext__()
                assert first.seq == 0
                health = await client.ping()
                assert health.active == chunks.request_id
                assert health.loaded
                assert health.round_trip < 5
            # Leaving the block cancelled the hanging request; the sidecar is free again.
            assert (await client.synthesize("after")).samples.tobytes() == expected("after")


async def test_load_with_progress_and_unload() -> None:
    events: list[ProgressEvent] = []
    with anyio.fail_after(20):
        async with fake_client(engine_options={"load_delay": 0.05}) as client:
            info = await client.load(on_progress=events.append)
            assert isinstance(info, LoadInfo)
            assert info.loaded is True and info.sample_rate == RATE
            assert set(info.timings) == {"queued", "load"} and info.timings["load"] >= 0.05
            # Still the map the sidecar sent, as load() returned before it was typed.
            assert info["loaded"] is True and info["sample_rate"] == RATE and info["load"] == info.timings["load"]
            assert dict(info) == {"loaded": True, "sample_rate": RATE, **info.timings, **info.info}
            again = await client.load()
            assert again.loaded and "load" not in again.timings  # already loaded: nothing to time
            assert (await client.ping()).loaded
            await client.unload()
            assert not (await client.ping()).loaded
    assert [e.stage for e in events] == ["load"] * 11
    assert [e.fraction for e in events][-1] == 1.0


async def test_load_failure_is_retryable() -> None:
    with anyio.fail_after(20):
        async with fake_client(engine_options={"load_failures": 1}) as client:
            with pytest.raises(LoadFailedError) as caught:
                await client.load()
            assert caught.value.retryable
            assert caught.value.code == "load_failed"
            assert "injected load failure" in caught.value.message
            await client.load()
            assert (await client.ping()).loaded


async def test_request_errors_are_typed() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            with pytest.raises(InvalidRequestError) as unknown:
                await client.synthesize("x", no_such_option=1)
            assert unknown.value.code == "unknown_option"
            assert unknown.value.detail["field"] == "$.options.no_such_option"
            assert unknown.value.request_id is not None

            with pytest.raises(InvalidRequestError) as invalid:
                await client.synthesize("x", delay=-1)
            assert invalid.value.code == "invalid_option"

            with pytest.raises(InvalidRequestError) as missing:
                await client.synthesize("x", voice="missing:nobody")
            assert missing.value.code == "invalid_input"

            with pytest.raises(InvalidRequestError) as rate:
                await client.synthesize("x", sample_rate=500)
            assert rate.value.code == "invalid_option"
            assert rate.value.detail["field"] == "$.sample_rate"

            with pytest.raises(EngineError) as failed:
                await client.synthesize("x", fail_at=0, fail_message="the engine broke")
            assert type(failed.value) is EngineError
            assert failed.value.code == "engine_error"
            assert "the engine broke" in str(failed.value)
            assert not failed.value.retryable

            assert (await client.synthesize("fine")).samples.tobytes() == expected("fine")


async def test_request_larger_than_the_max_frame_is_refused_locally() -> None:
    with anyio.fail_after(20):
        async with fake_client(sidecar_args=["--max-frame-size", "65536"]) as client:
            with pytest.raises(InvalidRequestError, match="max_frame_size"):
                await client.synthesize("x" * 70_000)
            assert (await client.synthesize("small")).samples.tobytes() == expected("small")
            assert client.restarts == 0


async def test_busy_when_the_queue_is_full() -> None:
    results: dict[int, Any] = {}
    with anyio.fail_after(20):
        async with fake_client(sidecar_args=["--max-queue", "1"]) as client:
            requests = [client.request(f"busy {i}", delay=0.05, chunk_seconds=0.02) for i in range(4)]
            for req in requests:
                await req.start()  # all four are on the wire, in order

            async def collect(i: int) -> None:
                try:
                    results[i] = await requests[i].result()
                except SidecarError as exc:
                    results[i] = exc

            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(collect, i)
    busy = [r for r in results.values() if isinstance(r, BusyError)]
    assert busy, results
    assert all(b.retryable and b.code == "busy" for b in busy)
    for i, result in results.items():
        if isinstance(result, Audio):
            assert result.samples.tobytes() == expected(f"busy {i}")
    assert isinstance(results[0], Audio)


async def test_hang_fires_the_idle_timeout_and_the_sidecar_survives() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            await client.load()
            pid = client.pid
            began = time.monotonic()
            with pytest.raises(RequestTimeoutError) as caught:
                await client.synthesize("hang", hang_at=1, chunk_seconds=0.01, idle_timeout=0.3)
            assert 0.3 <= time.monotonic() - began < 5
            error = caught.value
            assert isinstance(error, TimeoutError)
            assert error.deadline == "idle_timeout"
            assert error.seconds == 0.3
            assert "idle_timeout" in str(error)
            # The hanging request was cancelled; the same sidecar serves the next one.
            assert (await client.synthesize("next")).samples.tobytes() == expected("next")
            assert client.pid == pid and client.restarts == 0


async def test_a_nearer_deadline_fires_while_a_farther_one_waits() -> None:
    # One alarm per connection serves every waiting request: a request whose deadline is
    # nearer than those already waiting must still fire on time, and the others wait on.
    with anyio.fail_after(20):
        async with fake_client() as client:
            await client.load()
            outcome: dict[str, Any] = {}
            hanging = anyio.Event()

            async def far() -> None:
                try:
                    async with client.request("hang", hang_at=1, chunk_seconds=0.01, idle_timeout=60) as request:
                        async for _ in request.events():
                            hanging.set()  # its first chunk came; it hangs before the second
                except anyio.get_cancelled_exc_class():
                    outcome["far"] = "cancelled"
                    raise

            async with anyio.create_task_group() as tg:
                tg.start_soon(far)
                await hanging.wait()
                began = time.monotonic()
                with pytest.raises(RequestTimeoutError) as near:
                    await client.synthesize("queued behind the hang", timeout=0.3)
                assert 0.3 <= time.monotonic() - began < 5
                assert near.value.deadline == "timeout" and near.value.seconds == 0.3
                with pytest.raises(RequestTimeoutError) as idle:
                    await client.synthesize("queued too", idle_timeout=0.2, timeout=30)
                assert idle.value.deadline == "idle_timeout"
                assert "far" not in outcome  # still waiting on its 60 s deadline
                tg.cancel_scope.cancel()
            assert outcome == {"far": "cancelled"}
            assert (await client.synthesize("next")).samples.tobytes() == expected("next")


async def test_overall_timeout_fires_despite_progress() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            await client.load()
            with pytest.raises(RequestTimeoutError) as caught:
                await client.synthesize(
                    "slow", seconds=5, chunk_seconds=0.01, delay=0.01, timeout=0.3, idle_timeout=0.2
                )
            assert caught.value.deadline == "timeout"
            assert caught.value.seconds == 0.3
            assert (await client.synthesize("next")).samples.tobytes() == expected("next")


async def test_client_wide_default_deadlines_and_per_call_override() -> None:
    with anyio.fail_after(20):
        async with fake_client(idle_timeout=0.2) as client:
            # Only deadlines that must fire are short: every call that must succeed lifts
            # them (a per-call override), so no timing margin is involved. The load takes
            # 0.1-0.2 s on a loaded machine, as long as the client-wide idle deadline.
            await client.load(idle_timeout=None)
            began = time.monotonic()
            with pytest.raises(RequestTimeoutError) as idle:
                await client.synthesize("hang", hang_at=0)
            assert idle.value.deadline == "idle_timeout" and idle.value.seconds == 0.2
            assert time.monotonic() - began >= 0.2
            with pytest.raises(RequestTimeoutError) as overall:
                await client.synthesize("hang", hang_at=0, idle_timeout=None, timeout=0.3)
            assert overall.value.deadline == "timeout" and overall.value.seconds == 0.3
            assert (await client.synthesize("ok", idle_timeout=None)).samples.tobytes() == expected("ok")


async def test_cancelling_the_caller_cancels_the_request_only() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            pid = client.pid
            running = anyio.Event()

            def on_progress(event: ProgressEvent) -> None:
                if event.stage == "synthesize":
                    running.set()

            async with anyio.create_task_group() as tg:

                async def hang() -> None:
                    await client.synthesize("hang", hang_at=1, chunk_seconds=0.01, on_progress=on_progress)

                tg.start_soon(hang)
                await running.wait()
                tg.cancel_scope.cancel()
            # Were the hanging request still running, this one would wait forever behind it.
            assert (await client.synthesize("after")).samples.tobytes() == expected("after")
            health = await client.ping()
            assert health.active is None and health.queue_depth == 0
            assert client.pid == pid and client.restarts == 0


async def test_failing_callback_fails_only_its_own_request() -> None:
    class Boom(Exception):
        pass

    def explode(event: ProgressEvent) -> None:
        if event.stage == "synthesize":
            raise Boom("callback failed")

    results: dict[str, Any] = {}
    with anyio.fail_after(20):
        async with fake_client() as client:
            await client.load()

            async def run(name: str, **kwargs: Any) -> None:
                try:
                    results[name] = await client.synthesize(name, **kwargs)
                except Boom as exc:
                    results[name] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(run, "boom", on_progress=explode, seconds=10, chunk_seconds=0.01))
                tg.start_soon(run, "fine")
            assert isinstance(results["boom"], Boom)
            assert results["fine"].samples.tobytes() == expected("fine")
            # The failed request (10 s of audio) was cancelled on the sidecar.
            assert (await client.synthesize("then", timeout=5)).samples.tobytes() == expected("then")


async def test_slow_callback_does_not_stall_other_requests() -> None:
    release = anyio.Event()
    stalled = anyio.Event()

    async def slow(event: ProgressEvent) -> None:
        if event.stage == "synthesize":
            stalled.set()
            await release.wait()

    with anyio.fail_after(20):
        async with fake_client() as client:
            await client.load()
            async with anyio.create_task_group() as tg:
                slow_result: list[Audio] = []

                async def run_slow() -> None:
                    slow_result.append(await client.synthesize("slow one", on_progress=slow, chunk_seconds=0.02))

                tg.start_soon(run_slow)
                await stalled.wait()
                # The slow callback is blocked; other requests flow meanwhile.
                for i in range(3):
                    assert (await client.synthesize(f"other {i}")).samples.tobytes() == expected(f"other {i}")
                release.set()
            assert slow_result[0].samples.tobytes() == expected("slow one")


async def test_leaving_a_stream_early_cancels_it() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            # 60 s of audio at 10 ms per 50 ms chunk: 12 s if it were not cancelled.
            async with client.stream("endless", seconds=60, chunk_seconds=0.05, delay=0.01) as chunks:
                async for chunk in chunks:
                    assert chunk.seq == 0
                    break
            assert chunks.finished
            began = time.monotonic()
            assert (await client.synthesize("next")).samples.tobytes() == expected("next")
            assert time.monotonic() - began < 5

            # The same with an explicit start(), plain iteration and an explicit aclose().
            stream = client.stream("endless", seconds=60, chunk_seconds=0.05, delay=0.01)
            await stream.start()
            async for _chunk in stream:
                break
            await stream.aclose()
            assert (await client.synthesize("again")).samples.tobytes() == expected("again")


async def test_pending_requests_end_when_the_client_closes() -> None:
    results: dict[str, Any] = {}
    with anyio.fail_after(20):
        async with fake_client() as client:
            await client.load()
            running = client.request("running", hang_at=1, chunk_seconds=0.01)
            queued = client.request("queued")
            await running.start()
            await queued.start()
            first = await running.events().__anext__()
            assert isinstance(first, (ProgressEvent, AudioChunk))

            async def wait(name: str, req: Any) -> None:
                try:
                    results[name] = await req.result()
                except SidecarError as exc:
                    results[name] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait, "running", running)
                tg.start_soon(wait, "queued", queued)
                await client.aclose()
    assert isinstance(results["running"], RequestCancelledError)
    assert results["running"].code == "shutting_down"
    assert isinstance(results["queued"], RequestCancelledError)
    assert results["queued"].code == "shutting_down"


async def test_two_hundred_concurrent_requests_with_interleaved_cancels() -> None:
    count = 200
    results: dict[int, Audio] = {}
    cancelled: set[int] = set()
    with anyio.fail_after(60):
        async with fake_client(sidecar_args=["--max-queue", "256"]) as client:
            await client.load()

            async def run(i: int) -> None:
                text = f"request number {i}"
                with anyio.CancelScope() as scope:
                    if i % 7 == 3:
                        scope.cancel()  # cancelled before (or while) it is sent

                    def on_progress(event: ProgressEvent) -> None:
                        if i % 5 == 1 and event.stage == "synthesize":
                            scope.cancel()  # cancelled while it runs

                    results[i] = await client.synthesize(text, on_progress=on_progress, chunk_seconds=0.02)
                if scope.cancelled_caught:
                    cancelled.add(i)

            async with anyio.create_task_group() as tg:
                for i in range(count):
                    tg.start_soon(run, i)
            assert (await client.ping()).queue_depth == 0
            assert client.restarts == 0
    assert cancelled >= {i for i in range(count) if i % 7 == 3}
    assert cancelled.isdisjoint(results)
    assert len(results) + len(cancelled) == count
    assert len(results) > count // 2
    for i, audio in results.items():
        assert audio.samples.tobytes() == expected(f"request number {i}"), i


async def test_voices_of_an_engine_without_named_voices_are_refused_at_once() -> None:
    with anyio.fail_after(20):
        async with fake_client() as client:
            with pytest.raises(InvalidRequestError) as caught:
                await client.voices()
            assert caught.value.code == "invalid_input" and "has no named voices" in caught.value.message
            assert not (await client.ping()).loaded


async def test_each_chunk_names_the_part_of_the_text_it_speaks() -> None:
    # 0.1 s a character (800 samples at 8 kHz) in chunks of 0.25 s (2,000): two and a half
    # characters a chunk, so the character a chunk's end cuts belongs to both chunks' spans.
    with anyio.fail_after(30):
        async with fake_client() as client:
            async with client.stream("abcdefgh", seconds_per_char=0.1, chunk_seconds=0.25) as stream:
                chunks = [chunk async for chunk in stream]
            assert [(c.offset_samples, c.last_sample, c.text_span) for c in chunks] == [
                (0, 1999, (0, 3)),
                (2000, 3999, (2, 5)),
                (4000, 5999, (5, 8)),
                (6000, 6399, (7, 8)),
            ]
            # Audio longer than the text's own repeats it: no span names that.
            async with client.stream("ab", seconds=1.0) as stream:
                assert {chunk.text_span async for chunk in stream} == {None}
