"""A job whose parent takes its audio whole and wants no progress sends each audio frame one frame late.

Each frame is held until the job's next frame, its progress or its terminal frame, and goes
out with it in one write: a short ``synthesize()`` wakes its parent once.  The frames, their
order and their bytes are those a streamed job sends; only the writes that carry them differ.
A streamed job, or one that asked for progress, writes each frame at once.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Union

import msgspec

from indextts_sidecar import protocol
from indextts_sidecar._jobs import Job, JobOutput, cancelled_error
from indextts_sidecar._wire import MsgpackWire
from indextts_sidecar.engines import SynthesisRequest
from indextts_sidecar.engines.fake import FakeRequestOptions
from indextts_sidecar.protocol import Audio, Done, Error


class _Outbox:
    """Keeps each write (what one ``put`` or ``put_if_free`` hands over) as the frames it holds."""

    def __init__(self) -> None:
        self.writes: list[list[protocol.Reply]] = []
        self.audio_slots = threading.Semaphore(4)

    def put_if_free(self, parts: Sequence[Union[bytes, memoryview]]) -> bool:
        self.put(parts)
        return True

    def put(self, parts: Sequence[Union[bytes, memoryview]], audio: bool = False) -> None:
        data = b"".join(bytes(part) for part in parts)
        frames = []
        while data:
            size = int.from_bytes(data[: protocol.HEADER], "big")
            frames.append(protocol.decode_reply(data[protocol.HEADER : protocol.HEADER + size]))
            data = data[protocol.HEADER + size :]
        self.writes.append(frames)


class _Board:
    lock = threading.RLock()

    def waiting_jobs(self, kind: str) -> Any:
        return iter(())


def _output() -> tuple[JobOutput, _Outbox, dict[int, Job]]:
    outbox = _Outbox()
    live: dict[int, Job] = {}
    out = JobOutput(
        outbox,  # type: ignore[arg-type]
        MsgpackWire(),
        _Board(),
        live,
        max_frame_size=protocol.DEFAULT_MAX_FRAME_SIZE,
        write_timeout=None,
        on_stalled=lambda why: None,
    )
    return out, outbox, live


def _job(stream: bool, progress: bool = False) -> Job:
    request = SynthesisRequest(
        id=7, text="x", voice=None, emotion=None, options=FakeRequestOptions(), sample_rate=None, stream=stream
    )
    return Job(7, "synthesize", request, progress_wanted=progress)


def _kinds(writes: list[list[protocol.Reply]]) -> list[list[tuple[str, int]]]:
    """Each write as its frames' (kind, seq or -1)."""
    return [[(type(frame).__name__, getattr(frame, "seq", -1)) for frame in write] for write in writes]


def _audio(out: JobOutput, job: Job, seq: int, pcm: bytearray) -> None:
    assert out.audio(job, seq, 24000, memoryview(pcm))


def test_a_whole_request_writes_each_audio_frame_with_the_next_and_the_last_with_done() -> None:
    out, outbox, live = _output()
    job = _job(stream=False)
    live[job.id] = job
    buffer = bytearray(b"\x01\x00" * 8)
    _audio(out, job, 0, buffer)
    assert outbox.writes == []  # held until the next frame
    buffer[:] = b"\x02\x00" * 8  # the engine writes over its buffer: the held frame kept a copy
    _audio(out, job, 1, buffer)
    out.finish(job, Done(id=7, samples=16, chunks=2, sample_rate=24000))
    assert _kinds(outbox.writes) == [[("Audio", 0)], [("Audio", 1), ("Done", -1)]]
    first, second = outbox.writes[0][0], outbox.writes[1][0]
    assert isinstance(first, Audio) and bytes(first.pcm) == b"\x01\x00" * 8
    assert isinstance(second, Audio) and bytes(second.pcm) == b"\x02\x00" * 8
    assert job.held is None and job.id not in live


def test_a_sign_of_life_and_an_error_go_out_behind_the_held_frame() -> None:
    out, outbox, _ = _output()
    job = _job(stream=False)
    _audio(out, job, 0, bytearray(4))
    job.last_frame -= protocol.QUIET_PROGRESS_INTERVAL  # a quiet spell: the next progress is a sign of life
    out.progress(job, "synthesize", 0.5, "")
    _audio(out, job, 1, bytearray(4))
    job.cancel.set()
    out.finish(job, cancelled_error(job))
    assert _kinds(outbox.writes) == [[("Audio", 0), ("Progress", -1)], [("Audio", 1), ("Error", -1)]]
    # A frame that comes after the terminal one is dropped, as for any ended job.
    _audio(out, job, 2, bytearray(4))
    assert len(outbox.writes) == 2


def test_a_streamed_request_or_one_that_wants_progress_writes_each_frame_at_once() -> None:
    for stream, progress in ((True, False), (False, True), (True, True)):
        out, outbox, _ = _output()
        job = _job(stream=stream, progress=progress)
        _audio(out, job, 0, bytearray(4))
        _audio(out, job, 1, bytearray(4))
        out.finish(job, Done(id=7, samples=4, chunks=2, sample_rate=24000))
        assert _kinds(outbox.writes) == [[("Audio", 0)], [("Audio", 1)], [("Done", -1)]]


def test_held_and_streamed_frames_are_the_same_bytes() -> None:
    frames: dict[bool, list[bytes]] = {}
    for stream in (False, True):
        out, outbox, _ = _output()
        job = _job(stream=stream)
        for seq in range(3):
            _audio(out, job, seq, bytearray(bytes([seq, 0]) * 5))
        out.finish(job, Error(code="cancelled", id=7, message="cancelled while running"))
        frames[stream] = [msgspec.msgpack.encode(frame) for write in outbox.writes for frame in write]
    assert frames[False] == frames[True] and len(frames[True]) == 4
