"""The sidecar over real pipes: every message type, every invariant, the seed's flaws fixed.

Flaw numbers refer to ../shared/reference/seed-baseline.md.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import anyio
import msgspec
import pytest
from harness import REPO, pcm_of, sidecar, spawn

from indextts_sidecar import protocol
from indextts_sidecar.engines.fake import render_bytes
from indextts_sidecar.protocol import (
    Audio,
    Cancel,
    Done,
    Error,
    Load,
    Ok,
    Ping,
    Pong,
    Progress,
    Ready,
    Shutdown,
    Synthesize,
    Unload,
)

pytestmark = pytest.mark.anyio


async def test_ready_is_the_first_frame_and_describes_the_sidecar() -> None:
    with anyio.fail_after(10):
        async with spawn("fake", "-o", "sample_rate=16000", "--max-frame-size", "1000000") as peer:
            ready = await peer.expect(Ready)
            assert ready.protocol == protocol.PROTOCOL_VERSION == 1
            assert ready.engine == "fake"
            assert ready.pid == peer.process.pid
            assert ready.sample_rate == 16000
            assert ready.max_frame_size == 1_000_000
            assert "streaming" in ready.capabilities
            assert ready.options["sample_rate"] == 16000
            pong = await _ping(peer, 1)
            assert pong.loaded is False, "ready must come before the engine loads"


def test_ready_path_imports_no_heavy_module() -> None:
    code = textwrap.dedent(
        """
        import sys
        import indextts_sidecar._main, indextts_sidecar.engines.fake
        import indextts_sidecar.engines.espeak, indextts_sidecar.engines.indextts
        heavy = sorted(m for m in ("numpy", "torch", "anyio", "indextts", "espeakng_loader") if m in sys.modules)
        print(",".join(heavy))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == ""


def _replies(data: bytes) -> list[protocol.Reply]:
    """The frames a sidecar wrote to its stdout, decoded."""
    decoder = msgspec.msgpack.Decoder(protocol.Reply)
    replies: list[protocol.Reply] = []
    while data:
        size = int.from_bytes(data[:4], "big")
        replies.append(decoder.decode(data[4 : 4 + size]))
        data = data[4 + size :]
    return replies


def test_ready_means_usable_and_comes_before_the_engine_dependencies() -> None:
    # ``ready`` goes out once the server reads requests: answering the ping that follows
    # it imports nothing more (no event loop start-up left to pay), and the engine's own
    # dependencies are still unloaded (the model loads at the first request).
    # (Reported as the frames are made: the sidecar may leave with os._exit.)
    code = textwrap.dedent(
        """
        import os, sys
        from indextts_sidecar import protocol
        from indextts_sidecar._main import main

        frame, at_ready = protocol.frame, set()

        def report(key, names):
            os.write(2, f"{key}:{','.join(sorted(names))}\\n".encode())

        def spy(message):
            if isinstance(message, protocol.Ready):
                at_ready.update(sys.modules)
                report("engine", {"numpy", "torch", "indextts"} & at_ready)
            elif isinstance(message, protocol.Pong):
                report("after", set(sys.modules) - at_ready)
            return frame(message)

        protocol.frame = spy
        sys.exit(main(["--engine", "fake", "--log-level", "warning"]))
        """
    )
    requests = protocol.frame(Ping(id=1))
    out = subprocess.run(
        [sys.executable, "-c", code], input=requests, capture_output=True, cwd=REPO, timeout=30, check=True
    )
    replies = _replies(out.stdout)
    assert [type(r) for r in replies[:2]] == [Ready, Pong] and replies[1].id == 1
    report = [line.split(":", 1) for line in out.stderr.decode().splitlines()]
    lines = {key: value for key, value in report if key in ("after", "engine")}
    assert lines == {"after": "", "engine": ""}


def _exit_with_an_engine_thread_that_ends_after(seconds: float) -> subprocess.CompletedProcess[bytes]:
    """A sidecar answers a ping and reaches the end of its input; its engine thread, once
    closed, takes ``seconds`` to end.  Its stderr says whether atexit handlers ran."""
    code = textwrap.dedent(
        f"""
        import atexit, os, sys, time
        from indextts_sidecar import _scheduler
        from indextts_sidecar._main import main

        run = _scheduler.Scheduler._main

        def slow_to_end(self):
            run(self)
            time.sleep({seconds})

        _scheduler.Scheduler._main = slow_to_end
        atexit.register(lambda: os.write(2, b"atexit ran\\n"))
        sys.exit(main(["--engine", "fake", "--log-level", "warning"]))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        input=protocol.frame(Ping(id=1)),
        capture_output=True,
        cwd=REPO,
        timeout=30,
        check=False,
    )


def test_an_idle_sidecar_exits_through_the_interpreters_shutdown() -> None:
    # At the end of its input an idle sidecar ends like any program (atexit handlers run: an
    # engine's cleanup, logging's flush).  Here the engine thread takes 20 ms to end once
    # closed, as on a loaded machine; the sidecar waits up to ten times that for it.
    out = _exit_with_an_engine_thread_that_ends_after(0.02)
    assert out.returncode == 0, out.stderr
    assert b"atexit ran\n" in out.stderr


def test_an_engine_thread_that_never_ends_does_not_hold_the_exit() -> None:
    # As an engine stuck in native code: the sidecar leaves without it (os._exit), at once
    # after its wait; the parent's timeout of 30 s would fail the test otherwise.
    out = _exit_with_an_engine_thread_that_ends_after(3600)
    assert out.returncode == 0, out.stderr
    assert b"atexit ran" not in out.stderr


def test_a_finished_sidecar_skips_the_teardown_of_its_modules_but_not_the_exit_hooks() -> None:
    # With torch and upstream loaded, freeing every module took 2 s, past the client's grace:
    # every close ended in SIGTERM.  Here a module's object takes an hour to free: the sidecar
    # still leaves at once with its status, after the atexit handlers (the parent's timeout of
    # 30 s fails the test otherwise).  (_leave's own hook runs last: it is registered first.)
    code = textwrap.dedent(
        """
        import atexit, os, runpy, sys, time, types

        class SlowToFree:
            def __del__(self):
                time.sleep(3600)

        import indextts_sidecar._leave  # as python -m does, before anything registers a hook
        heavy = types.ModuleType("heavy")
        heavy.state = SlowToFree()
        sys.modules["heavy"] = heavy
        del heavy
        atexit.register(lambda: os.write(2, b"atexit ran\\n"))
        sys.argv = ["indextts_sidecar", "--engine", "fake", "--log-level", "warning"]
        runpy.run_module("indextts_sidecar", run_name="__main__", alter_sys=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=protocol.frame(Ping(id=1)),
        capture_output=True,
        cwd=REPO,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert b"atexit ran\n" in out.stderr
    replies = _replies(out.stdout)
    assert [type(r) for r in replies[:2]] == [Ready, Pong] and replies[1].id == 1


def test_the_server_loads_the_voice_store_only_for_a_voice_dir() -> None:
    # The store's hashlib and tempfile cost some 20 ms of a sidecar's start (OpenSSL loads).
    code = textwrap.dedent(
        """
        import sys
        import indextts_sidecar._main, indextts_sidecar._server
        print("indextts_sidecar._voices" in sys.modules or "indextts_sidecar.voicestore" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


async def _ping(peer, request_id: int) -> Pong:  # type: ignore[no-untyped-def]
    await peer.send(Ping(id=request_id))
    return await peer.expect(Pong)  # type: ignore[no-any-return]


async def test_synthesize_streams_exact_audio_then_done() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake", "-o", "chunk_seconds=0.1") as peer:
            await peer.send(Synthesize(id=7, text="hello world"))
            frames = await peer.until_terminal(7)
            assert all(getattr(f, "id", None) == 7 for f in frames)
            done = frames[-1]
            assert isinstance(done, Done)
            expected = render_bytes("hello world", 24000)
            assert pcm_of(frames) == expected  # flaw 7: every sample exact, no off-by-one LSB
            assert done.samples == len(expected) // 2 == round(11 * 0.06 * 24000)
            assert done.chunks == sum(isinstance(f, Audio) for f in frames) >= 7
            assert done.sample_rate == 24000
            assert {"queued", "load", "first_audio", "synthesis", "total"} <= set(done.timings)
            stages = [f.stage for f in frames if isinstance(f, Progress)]
            assert stages[:2] == ["started", "load"] and stages[-1] == "synthesize"


async def test_a_request_that_asks_for_no_progress_gets_only_signs_of_life() -> None:
    with anyio.fail_after(20):
        # A loaded engine: twenty chunks, each progress call right before its audio frame.
        async with sidecar("fake", "-o", "chunk_seconds=0.05") as peer:
            await peer.send(Load(id=1))
            await peer.until_terminal(1)
            await peer.send(Synthesize(id=2, text="twenty chunks", progress=False))
            frames = await peer.until_terminal(2)
            assert [type(f) for f in frames] == [Audio] * (len(frames) - 1) + [Done]
            assert pcm_of(frames) == render_bytes("twenty chunks", 24000)
            await peer.send(Synthesize(id=3, text="twenty chunks"))
            frames = await peer.until_terminal(3)
            progress = [f.stage for f in frames if isinstance(f, Progress)]
            assert progress == ["started"] + ["synthesize"] * sum(isinstance(f, Audio) for f in frames)
            assert len(progress) >= 16
        # A load of 2.5 s in ten progress steps and no audio meanwhile: a progress frame still
        # goes out once a second passed without one, and never more often than that.
        async with sidecar("fake", "-o", "load_delay=2.5") as peer:
            began = anyio.current_time()
            await peer.send(Synthesize(id=4, text="after a slow load", progress=False))
            frames = await peer.until_terminal(4)
            elapsed = anyio.current_time() - began
            loads = [f for f in frames if isinstance(f, Progress)]
            assert loads and all(p.stage == "load" for p in loads)
            assert len(loads) <= elapsed / protocol.QUIET_PROGRESS_INTERVAL + 1
            assert isinstance(frames[-1], Done)


async def test_audio_longer_than_a_frame_is_split_and_reassembled() -> None:
    with anyio.fail_after(20):
        async with sidecar("fake", "-o", "chunk_seconds=30", "--max-frame-size", "65536") as peer:
            await peer.send(Synthesize(id=1, text="abc", options={"seconds": 3.0}))
            frames = await peer.until_terminal(1)
            audio = [f for f in frames if isinstance(f, Audio)]
            assert len(audio) > 1 and all(len(a.pcm) <= 65536 for a in audio)
            assert pcm_of(frames) == render_bytes("abc", 24000, seconds=3.0)


async def test_load_unload_and_ping_report_the_model_state() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send(Load(id=1))
            frames = await peer.until_terminal(1)
            assert isinstance(frames[-1], Ok) and frames[-1].info["loaded"] is True
            fractions = [f.fraction for f in frames if isinstance(f, Progress)]
            assert fractions == sorted(fractions) and fractions[-1] == 1.0
            pong = await _ping(peer, 2)
            assert pong.loaded is True and pong.queue_depth == 0 and pong.active is None
            assert pong.memory["rss"] > 1_000_000
            await peer.send(Unload(id=3))
            assert (await peer.expect(Ok)).id == 3
            assert (await _ping(peer, 4)).loaded is False


async def test_ping_is_answered_while_inference_runs() -> None:
    """Flaw 4: the seed answered a ping only after the synthesis."""
    with anyio.fail_after(10):
        async with sidecar("fake", "-o", "chunk_seconds=0.1") as peer:
            await peer.send(Synthesize(id=1, text="x" * 20, options={"delay": 0.05}))
            while not isinstance(await peer.recv(), Audio):
                pass
            await peer.send(Ping(id=2))
            seen = []
            while True:
                reply = await peer.recv()
                seen.append(reply)
                if isinstance(reply, Pong):
                    assert reply.active == 1 and reply.loaded
                    break
                assert not isinstance(reply, Done), "the pong waited behind the synthesis"
            await peer.until_terminal(1)


async def test_cancel_drops_a_queued_request_at_once_and_stops_a_running_one() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake", "-o", "chunk_seconds=0.05") as peer:
            await peer.send(Synthesize(id=1, text="running", options={"hang_at": 2}))
            await peer.send(Synthesize(id=2, text="queued"))
            await peer.send(Cancel(id=3, target=2))
            first = await peer.collect({2, 3})
            per_id = first
            assert per_id[2][-1] == Error(code="cancelled", id=2, message="cancelled while queued")
            assert per_id[3][-1] == Ok(id=3, info={"found": True})
            assert not any(isinstance(f, Audio) for f in per_id[2])
            running = first.get(1, [])
            while sum(isinstance(f, Audio) for f in running) < 2:  # until request 1 hangs before chunk 2
                running.append(await peer.recv())  # type: ignore[arg-type]
            await peer.send(Cancel(id=4, target=1))
            per_id = await peer.collect({1, 4})
            error = per_id[1][-1]
            assert isinstance(error, Error) and error.code == "cancelled"
            assert not any(isinstance(f, Audio) for f in per_id[1])  # stopped at the chunk boundary
            await peer.send(Cancel(id=5, target=99))
            assert await peer.expect(Ok) == Ok(id=5, info={"found": False})
            # The model stays warm: the next request needs no load.
            await peer.send(Synthesize(id=6, text="after"))
            frames = await peer.until_terminal(6)
            assert pcm_of(frames) == render_bytes("after", 24000)
            assert "load" not in frames[-1].timings  # type: ignore[union-attr]


async def test_requests_carry_ids_and_interleave() -> None:
    """Flaw 3: replies, progress and errors all carry the request id."""
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send(Synthesize(id=10, text="first"))
            await peer.send(Synthesize(id=11, text="second", options={"fail_at": 0, "fail_message": "boom"}))
            await peer.send(Synthesize(id=12, text="third"))
            per_id = await peer.collect({10, 11, 12})
            assert pcm_of(per_id[10]) == render_bytes("first", 24000)
            assert pcm_of(per_id[12]) == render_bytes("third", 24000)
            error = per_id[11][-1]
            assert isinstance(error, Error) and (error.code, error.id, error.message) == ("engine_error", 11, "boom")
            assert all(isinstance(f, (Progress, Audio, Done, Error)) for frames in per_id.values() for f in frames)


async def test_every_request_gets_exactly_one_terminal_frame() -> None:
    with anyio.fail_after(20):
        async with sidecar("fake", "--max-queue", "8") as peer:
            ids = set(range(1, 41))
            for i in sorted(ids):
                kind = i % 5
                if kind == 0:
                    await peer.send(Ping(id=i))
                elif kind == 1:
                    await peer.send(Cancel(id=i, target=i - 2))
                elif kind == 2:
                    await peer.send(Synthesize(id=i, text=f"t{i}", options={"delay": 0.002}))
                elif kind == 3:
                    await peer.send(Synthesize(id=i, text=f"f{i}", options={"fail_at": 0}))
                else:
                    await peer.send(Load(id=i))
            per_id = await peer.collect(ids)  # asserts no id ends twice
            assert set(per_id) == ids
            codes = {f.code for frames in per_id.values() for f in frames if isinstance(f, Error)}
            assert codes <= {"cancelled", "busy", "engine_error"}


async def test_queue_limit_answers_busy_and_keeps_serving() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake", "--max-queue", "2") as peer:
            await peer.send(Synthesize(id=1, text="a", options={"hang_at": 0}))
            await peer.expect(Progress)  # the worker has taken request 1
            for i in (2, 3, 4):
                await peer.send(Synthesize(id=i, text="b"))
            busy = await peer.expect(Error)
            assert (busy.id, busy.code, busy.retryable) == (4, "busy", True)
            await peer.send(Cancel(id=5, target=1))
            per_id = await peer.collect({1, 2, 3, 5})
            assert per_id[1][-1].code == "cancelled"  # type: ignore[union-attr]
            assert pcm_of(per_id[2]) == pcm_of(per_id[3]) == render_bytes("b", 24000)


async def test_duplicate_id_in_flight_is_rejected() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send(Synthesize(id=1, text="a", options={"hang_at": 0}))
            await peer.send(Synthesize(id=1, text="again"))
            error = await peer.expect(Error)
            assert error.code == "duplicate_id" and error.id is None and error.detail["field"] == "$.id"
            await peer.send(Cancel(id=2, target=1))
            per_id = await peer.collect({1, 2})
            assert per_id[1][-1].code == "cancelled"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("message", "code", "field", "fragment", "request_id"),
    [
        (b"", "invalid_message", None, "empty frame", None),  # flaw 1: zero length
        (b"\xc1", "invalid_message", None, "not valid msgpack", None),  # flaw 1: undecodable
        ([1, 2], "invalid_message", "$", "got list", None),  # flaw 2: an array
        ("ping", "invalid_message", "$", "got str", None),  # flaw 2: a string
        ({"id": 5}, "invalid_message", "$.op", "no 'op'", 5),  # flaw 2: no op
        ({"op": "fly", "id": 5}, "unknown_op", "$.op", "unknown op 'fly'", 5),
        ({"op": "synthesize", "id": 5}, "invalid_message", "$.text", "text", 5),
        ({"op": "ping", "id": "x"}, "invalid_message", "$.id", "Expected `int`", None),
        (
            {"op": "synthesize", "id": 5, "text": "a", "emotion": {"kind": "vector", "happy": "x"}},
            "invalid_message",
            "$.emotion.happy",
            "Expected `float`",
            5,
        ),
    ],
)
async def test_invalid_messages_get_distinct_errors_and_the_sidecar_stays_up(
    message: object, code: str, field: str, fragment: str, request_id: int
) -> None:
    raw = message if isinstance(message, bytes) else msgspec.msgpack.encode(message)
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send_raw(len(raw).to_bytes(4, "big") + raw)
            error = await peer.expect(Error)
            assert error.code == code
            assert error.detail.get("field") == field
            assert fragment in error.message
            assert error.id == request_id  # when the id is readable, the error is that request's terminal frame
            pong = await _ping(peer, 77)
            assert pong.id == 77


async def test_unknown_request_option_is_rejected_naming_it() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send(Synthesize(id=1, text="a", options={"sede": 3}))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail["field"]) == (1, "unknown_option", "$.options.sede")
            await peer.send(Synthesize(id=2, text="a", options={"delay": -1}))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail["field"]) == (2, "invalid_option", "$.options.delay")
            await peer.send(Synthesize(id=3, text="a", sample_rate=10))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail["field"]) == (3, "invalid_option", "$.sample_rate")


async def test_a_requested_rate_is_produced_by_resampling_and_the_native_rate_is_untouched() -> None:
    import numpy as np

    from indextts_sidecar._resample import make_resampler

    with anyio.fail_after(10):
        async with sidecar("fake", "-o", "chunk_seconds=0.07") as peer:
            await peer.send(Synthesize(id=1, text="resample me", sample_rate=16000))
            await peer.send(Synthesize(id=2, text="resample me", sample_rate=24000))
            per_id = await peer.collect({1, 2})
            native = np.frombuffer(render_bytes("resample me", 24000), "<i2")
            assert pcm_of(per_id[2]) == native.tobytes()
            converted = np.frombuffer(pcm_of(per_id[1]), "<i2")
            done = per_id[1][-1]
            assert isinstance(done, Done) and done.sample_rate == 16000 and done.samples == len(converted)
            assert abs(len(converted) - len(native) * 2 / 3) <= 1
            # Chunked conversion equals converting the whole signal at once, with the same
            # (band-limited) converter this venv gives the sidecar.
            whole = make_resampler(24000, 16000)
            assert converted.tobytes() == whole.feed(native.tobytes()) + whole.flush()


async def test_frame_over_the_limit_is_reported_then_the_sidecar_exits() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake", "--max-frame-size", "65536") as peer:
            await peer.send_raw((65537).to_bytes(4, "big") + b"\x80")
            error = await peer.expect(Error)
            assert error.code == "frame_too_large" and error.id is None and "65537" in error.message
            assert await peer.recv() is None
            assert await peer.process.wait() == 3


async def test_stream_cut_mid_frame_is_reported_then_the_sidecar_exits() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send_raw(protocol.frame(Ping(id=1))[:-2])
            await peer.stdin.aclose()
            error = await peer.expect(Error)
            assert error.code == "truncated_frame" and "ended" in error.message
            assert await peer.recv() is None
            assert await peer.process.wait() == 3


async def test_partial_frame_then_silence_does_not_hang() -> None:
    """Flaw 5: the seed waited forever, then ate the next frame as the stalled one's tail."""
    with anyio.fail_after(10):
        async with sidecar("fake", "--frame-timeout", "0.3") as peer:
            # Loaded first: no load progress may arrive after the error below (a slow load, under load).
            await peer.request(Load(id=9))
            await peer.send(Synthesize(id=1, text="a", options={"hang_at": 0}))
            while (await peer.request(Ping(id=2)))[-1].active != 1:  # type: ignore[union-attr]
                pass  # until the engine runs it (it hangs before any frame)
            await peer.send_raw(protocol.frame(Ping(id=2))[:3])
            error = await peer.expect(Error)
            assert error.code == "truncated_frame" and "stalled" in error.message
            # The request in flight still gets its terminal frame before the exit.
            assert await peer.until_terminal(1) == [
                Error(code="shutting_down", id=1, message="the sidecar is shutting down")
            ]
            assert await peer.process.wait() == 3


async def test_stdout_prints_cannot_corrupt_frames() -> None:
    """Flaw 6: 1,000 requests, each printing through print() and straight to fd 1."""
    with anyio.fail_after(60):
        async with sidecar("fake", "-o", "seconds_per_char=0.001", "--max-queue", "100") as peer:
            expected = render_bytes("hi", 24000, seconds_per_char=0.001)
            for start in range(0, 1000, 100):
                ids = set(range(start, start + 100))
                for i in sorted(ids):
                    await peer.send(Synthesize(id=i, text="hi", options={"print_lines": 10}))
                per_id = await peer.collect(ids)
                assert all(pcm_of(frames) == expected for frames in per_id.values())
            stderr = peer.stderr()
            assert stderr.count("print() line") == 5000 and stderr.count("raw fd 1 line") == 5000


async def test_shutdown_is_acknowledged_after_pending_requests_end() -> None:
    """Flaw 10: the seed exited without a word."""
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send(Synthesize(id=1, text="a", options={"hang_at": 0}))
            await peer.send(Synthesize(id=2, text="b"))
            await peer.expect(Progress)
            await peer.send(Shutdown(id=3))
            per_id = await peer.collect({1, 2, 3})
            assert [f.code for f in (per_id[1][-1], per_id[2][-1])] == ["shutting_down", "shutting_down"]  # type: ignore[union-attr]
            assert per_id[3] == [Ok(id=3, info={"exit_code": 0})]
            assert await peer.recv() is None
            assert await peer.process.wait() == 0


async def test_stdin_eof_ends_everything_within_a_second() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send(Synthesize(id=1, text="a", options={"hang_at": 0}))
            await peer.expect(Progress)
            await peer.stdin.aclose()
            with anyio.fail_after(1.0):
                frames = await peer.until_terminal(1)
                assert frames[-1].code == "shutting_down"  # type: ignore[union-attr]
                assert await peer.process.wait() == 0


def _frames_of(data: bytes) -> list[protocol.Reply]:
    frames, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        frames.append(protocol.decode_reply(data[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    assert pos == len(data), "the output ends inside a frame"
    return frames


def test_stdin_from_dev_null_ends_cleanly() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "indextts_sidecar", "--engine", "fake"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    frames = _frames_of(result.stdout)
    assert isinstance(frames[0], Ready)
    assert [(type(f).__name__, getattr(f, "code", None), f.id) for f in frames[1:]] == [  # type: ignore[union-attr]
        ("Error", "shutting_down", None)
    ]
    assert b"Traceback" not in result.stderr


def test_requests_from_a_regular_file_all_run_and_the_replies_go_to_a_file(tmp_path: os.PathLike[str]) -> None:
    """stdin and stdout are plain byte streams: a file of requests in, a file of replies out."""
    requests = os.path.join(tmp_path, "requests.bin")
    replies = os.path.join(tmp_path, "replies.bin")
    with open(requests, "wb") as f:
        f.write(protocol.frame(Synthesize(id=1, text="from a file")))
        f.write(protocol.frame(Ping(id=2)))
        f.write(protocol.frame(Synthesize(id=3, text="and another", options={"chunk_seconds": 0.05})))
    with open(requests, "rb") as stdin, open(replies, "wb") as stdout:
        result = subprocess.run(
            [sys.executable, "-m", "indextts_sidecar", "--engine", "fake"],
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.PIPE,
            cwd=REPO,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert b"Traceback" not in result.stderr
    with open(replies, "rb") as f:
        frames = _frames_of(f.read())
    assert isinstance(frames[0], Ready)
    per_id: dict[int, list[protocol.Reply]] = {}
    for frame in frames[1:-1]:
        per_id.setdefault(frame.id, []).append(frame)  # type: ignore[union-attr, arg-type]
    assert sorted(per_id) == [1, 2, 3]
    assert isinstance(per_id[2][-1], Pong)
    assert pcm_of(per_id[1]) == render_bytes("from a file", 24000) and isinstance(per_id[1][-1], Done)
    assert pcm_of(per_id[3]) == render_bytes("and another", 24000) and isinstance(per_id[3][-1], Done)
    last = frames[-1]
    assert isinstance(last, Error) and last.code == "shutting_down" and last.id is None


@pytest.mark.parametrize("closed", ["<&-", ">&-"])
def test_a_closed_stdin_or_stdout_is_one_line_on_stderr_and_exit_2(closed: str) -> None:
    result = subprocess.run(
        f"exec {sys.executable} -m indextts_sidecar --engine fake </dev/null {closed}",
        shell=True,
        stdout=subprocess.DEVNULL if closed == "<&-" else None,
        stderr=subprocess.PIPE,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        "indextts_sidecar: standard input and output must be open: Bad file descriptor"
    ]


async def test_sigterm_ends_everything_within_a_second() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send(Synthesize(id=1, text="a", options={"hang_at": 0}))
            await peer.expect(Progress)
            peer.process.send_signal(signal.SIGTERM)
            with anyio.fail_after(1.0):
                frames = await peer.until_terminal(1)
                assert frames[-1].code == "shutting_down"  # type: ignore[union-attr]
                assert await peer.process.wait() == 0


async def test_failed_load_fails_the_request_and_the_next_one_retries() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake", "-o", "load_failures=1") as peer:
            await peer.send(Synthesize(id=1, text="a"))
            await peer.send(Synthesize(id=2, text="b"))
            per_id = await peer.collect({1, 2})
            error = per_id[1][-1]
            assert isinstance(error, Error) and error.code == "load_failed" and error.retryable
            assert "injected load failure 1 of 1" in error.message
            assert pcm_of(per_id[2]) == render_bytes("b", 24000)
            # Load progress reached the request waiting behind the failed load too.
            assert any(isinstance(f, Progress) and f.stage == "load" for f in per_id[2])


async def test_crash_fault_exits_with_the_requested_code() -> None:
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send(
                Synthesize(id=1, text="abc", options={"crash_at": 1, "chunk_seconds": 0.05, "exit_code": 42})
            )
            frames = []
            while (reply := await peer.recv()) is not None:
                frames.append(reply)
            # Frames still queued in the writer die with the process, as in any crash.
            assert sum(isinstance(f, Audio) for f in frames) <= 1
            assert await peer.process.wait() == 42
            assert "crashing with exit code 42" in peer.stderr()


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--engine", "nope"], "unknown_engine", "unknown engine 'nope'"),
        (["--engine", "fake", "-o", "sample_rate=12"], "invalid_option", "sample_rate"),
        (["--engine", "fake", "-o", "colour=blue"], "invalid_option", "colour"),
    ],
)
def test_startup_errors_are_reported_as_a_frame_and_exit_2(args: list[str], code: str, fragment: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "indextts_sidecar", *args], capture_output=True, cwd=REPO, timeout=30, check=False
    )
    assert result.returncode == 2
    size = int.from_bytes(result.stdout[:4], "big")
    assert len(result.stdout) == 4 + size
    error = protocol.decode_reply(result.stdout[4:])
    assert isinstance(error, Error) and error.code == code and error.id is None and fragment in error.message
    assert fragment in result.stderr.decode()


async def test_third_party_engine_registers_through_an_entry_point(tmp_path: os.PathLike[str]) -> None:
    root = os.fspath(tmp_path)
    os.makedirs(os.path.join(root, "thirdparty_engine"))
    with open(os.path.join(root, "thirdparty_engine", "__init__.py"), "w") as f:
        f.write(
            textwrap.dedent(
                """
                from indextts_sidecar.engines.fake import FakeEngine

                class Tone(FakeEngine):
                    name = "tone"
                """
            )
        )
    dist = os.path.join(root, "thirdparty_engine-1.0.dist-info")
    os.makedirs(dist)
    with open(os.path.join(dist, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: thirdparty-engine\nVersion: 1.0\n")
    with open(os.path.join(dist, "entry_points.txt"), "w") as f:
        f.write("[indextts_sidecar.engines]\ntone = thirdparty_engine:Tone\n")
    with anyio.fail_after(10):
        async with spawn("tone", env={"PYTHONPATH": os.pathsep.join([root, REPO])}) as peer:
            ready = await peer.expect(Ready)
            assert ready.engine == "tone"
            await peer.send(Synthesize(id=1, text="x"))
            assert pcm_of(await peer.until_terminal(1)) == render_bytes("x", 24000)


async def test_espeak_engine_speaks() -> None:
    with anyio.fail_after(30):
        async with sidecar("espeak") as peer:
            await peer.send(Synthesize(id=1, text="Hello."))
            await peer.send(
                Synthesize(id=2, text="Hello there. This sentence is a good deal longer than the first one.")
            )
            per_id = await peer.collect({1, 2})
            short, long = pcm_of(per_id[1]), pcm_of(per_id[2])
            import numpy as np

            short_samples = np.frombuffer(short, "<i2").astype(np.float64)
            long_samples = np.frombuffer(long, "<i2").astype(np.float64)
            assert len(long_samples) > 3 * len(short_samples) > 0
            assert np.sqrt(np.mean(short_samples**2)) > 300
            assert per_id[2][-1].sample_rate == 22050  # type: ignore[union-attr]
            assert sum(isinstance(f, Audio) for f in per_id[2]) >= 2  # one chunk per sentence at least
