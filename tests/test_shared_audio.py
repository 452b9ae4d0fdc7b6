"""The shared-memory audio ring: its rules, and audio through it end to end."""

from __future__ import annotations

import os
from collections import deque

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indextts_client import Client
from indextts_client._process import shared_audio_supported
from indextts_sidecar.engines.fake import render_bytes
from indextts_sidecar.protocol.shm import HEADER_SIZE, AudioRing, RingError, create_shared_memory

pytestmark = pytest.mark.skipif(not shared_audio_supported(), reason="the shared audio ring needs Linux on x86-64")


def _pair(capacity: int) -> tuple[AudioRing, AudioRing]:
    fd = create_shared_memory(HEADER_SIZE + capacity)
    try:
        return AudioRing(fd), AudioRing(fd)
    finally:
        os.close(fd)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(16, 512),
    st.lists(st.tuples(st.integers(1, 600), st.booleans()), max_size=60),
)
def test_ring_never_hands_out_unreleased_space_and_keeps_every_byte(
    capacity: int, steps: list[tuple[int, bool]]
) -> None:
    producer, consumer = _pair(capacity)
    in_flight: deque[tuple[int, bytes]] = deque()
    counter = 0
    try:
        for size, consume in steps:
            data = bytes((counter + i) % 251 for i in range(size))
            counter += 1
            position = producer.write(memoryview(data))
            if position is None:
                # Refused only when it cannot fit: too big, or the space is not yet released.
                start = producer.head
                if start % capacity + size > capacity:
                    start += capacity - start % capacity
                assert size > capacity or start + size - consumer.released > capacity
            else:
                assert position % capacity + size <= capacity  # never wraps
                in_flight.append((position, data))
            if consume and in_flight:
                position, expected = in_flight.popleft()
                out = bytearray(len(expected))
                consumer.read_into(position, len(expected), memoryview(out))
                assert bytes(out) == expected  # nothing overwrote it while it waited
        while in_flight:
            position, expected = in_flight.popleft()
            out = bytearray(len(expected))
            consumer.read_into(position, len(expected), memoryview(out))
            assert bytes(out) == expected
    finally:
        producer.close()
        consumer.close()


def test_ring_rejects_regions_that_break_its_rules() -> None:
    producer, consumer = _pair(100)
    try:
        position = producer.write(memoryview(b"x" * 60))
        assert position == 0
        consumer.read_into(0, 60, memoryview(bytearray(60)))
        with pytest.raises(RingError):  # already released
            consumer.read_into(0, 60, memoryview(bytearray(60)))
        with pytest.raises(RingError):  # would wrap
            consumer.release(90, 20)
        with pytest.raises(RingError):  # larger than the ring
            consumer.release(100, 101)
        assert producer.write(memoryview(b"y" * 60)) == 100  # skipped the 40 bytes at the end
    finally:
        producer.close()
        consumer.close()


@pytest.mark.anyio
@pytest.mark.parametrize("ring_size", [0, 200_000, 8 * 1024 * 1024])
async def test_audio_through_the_ring_is_exact_with_wraps_and_fallbacks(ring_size: int) -> None:
    """0: no ring.  200 kB: 48 kB chunks wrap around and, when the ring is full, fall back to the pipe."""
    with anyio.fail_after(60):
        async with Client(
            engine="fake",
            engine_options={"chunk_seconds": 1.0},
            shared_audio=ring_size,
            sidecar_args=["--log-level", "WARNING"],
        ) as client:
            assert ("shared_audio" in client.info.capabilities) == (ring_size > 0)
            requests = [("ring test", 20.0), ("short", None), ("another long one", 7.5)]
            async with anyio.create_task_group() as tg:
                results: dict[int, bytes] = {}

                async def run(index: int, text: str, seconds: float | None) -> None:
                    options = {} if seconds is None else {"seconds": seconds}
                    audio = await client.synthesize(text, **options)
                    results[index] = audio.samples.tobytes()

                for index, (text, seconds) in enumerate(requests):
                    tg.start_soon(run, index, text, seconds)
            for index, (text, seconds) in enumerate(requests):
                assert results[index] == render_bytes(text, 24000, seconds=seconds)
            chunks = []
            async with client.stream("streamed through the ring", seconds=5.0) as stream:
                async for chunk in stream:
                    chunks.append(chunk.samples.tobytes())
            assert b"".join(chunks) == render_bytes("streamed through the ring", 24000, seconds=5.0)


def test_assembler_copies_from_the_ring_straight_into_its_buffer_and_releases_bad_frames() -> None:
    from indextts_client._audio import AudioAssembler
    from indextts_client._exceptions import ProtocolError

    producer, consumer = _pair(1000)
    try:
        assembler = AudioAssembler(7, keep=True)
        first = producer.write(memoryview(bytes(range(100))))
        second = producer.write(memoryview(bytes(range(100, 200))))
        assert first is not None and second is not None
        assembler.add_shared(0, 16000, consumer, first, 100)
        with pytest.raises(ProtocolError, match="seq 5 arrived, expected 1"):
            assembler.add_shared(5, 16000, consumer, second, 100)
        assert consumer.released == second + 100  # released all the same: the ring keeps flowing
        assembler.check_done(50, 1, 16000)
        assert assembler.assemble().tobytes() == bytes(range(100))
    finally:
        producer.close()
        consumer.close()
