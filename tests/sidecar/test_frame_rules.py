"""The sidecar's rules for frames and ids: a bad frame costs that frame only,
and every readable id gets its terminal frame.
"""

from __future__ import annotations

import anyio
import msgspec
import pytest
from client_support import fake_client
from harness import pcm_of, sidecar

from indextts_client import InvalidRequestError
from indextts_sidecar import protocol
from indextts_sidecar.engines.fake import render_bytes
from indextts_sidecar.protocol import Cancel, Error, Ok, Ping, Pong, Shutdown, Synthesize

pytestmark = pytest.mark.anyio

_enc = msgspec.msgpack.encode


def frame_of(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def raw_map(*pairs: bytes) -> bytes:
    """A msgpack map of already encoded keys and values (at most 15 pairs)."""
    assert len(pairs) % 2 == 0 and len(pairs) < 32
    return bytes([0x80 | len(pairs) // 2]) + b"".join(pairs)


def deep_list(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


async def assert_alive(peer: object, request_id: int) -> None:
    replies = await peer.request(Ping(id=request_id))  # type: ignore[attr-defined]
    assert isinstance(replies[-1], Pong) and replies[-1].id == request_id


@pytest.mark.parametrize("depth", [63, 1000, 100_000])
async def test_deep_nesting_costs_that_message_only(depth: int) -> None:
    with anyio.fail_after(20):
        async with sidecar("fake") as peer:
            # The reproducer: a bare list nested ``depth`` deep.
            await peer.send_raw(frame_of(deep_list(depth)))
            error = await peer.expect(Error)
            assert error.id is None and error.code == "invalid_message"
            # A request whose options nest that deep: its id is readable, so it gets its terminal frame.
            body = raw_map(
                _enc("op"), _enc("synthesize"), _enc("id"), _enc(5), _enc("text"), _enc("hi"),
                _enc("options"), raw_map(_enc("nested"), deep_list(depth)),
            )  # fmt: skip
            await peer.send_raw(frame_of(body))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail["field"]) == (5, "invalid_message", "$")
            assert f"nested {depth + 2} levels deep" in error.message
            await assert_alive(peer, 6)
            await peer.send(Synthesize(id=7, text="after"))
            frames = await peer.until_terminal(7)
            assert type(frames[-1]).__name__ == "Done"


async def test_every_op_goes_through_the_same_id_rules() -> None:
    with anyio.fail_after(20):
        async with sidecar("fake") as peer:
            await peer.send(Synthesize(id=7, text="hang", options={"hang_at": 0}))
            await assert_alive(peer, 1)  # 7 is queued or running now
            for duplicate in (Ping(id=7), Cancel(id=7, target=7), Cancel(id=7, target=99), Shutdown(id=7)):
                await peer.send(duplicate)
                error = await peer.expect(Error)
                refusal = (error.id, error.code, error.detail)
                assert refusal == (None, "duplicate_id", {"field": "$.id", "id": 7}), duplicate
            # The shutdown was refused: the sidecar serves on, and request 7 is untouched: running, or
            # still the one request waiting for the engine (a busy machine may not have started it yet).
            health = await peer.request(Ping(id=2))
            pong = health[-1]
            assert isinstance(pong, Pong) and (pong.active, pong.queue_depth) in ((7, 0), (None, 1)), pong
            # A cancel naming itself is rejected with its own terminal frame.
            await peer.send(Cancel(id=8, target=8))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail["field"]) == (8, "invalid_message", "$.target")
            await peer.send(Cancel(id=9, target=7))
            per_id = await peer.collect({7, 9})  # asserts that no id ends twice
            assert isinstance(per_id[9][-1], Ok) and per_id[9][-1].info == {"found": True}
            last = per_id[7][-1]
            assert isinstance(last, Error) and last.code == "cancelled"


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ((_enc("text"), b"\xa2\xff\xfe"), "utf-8"),  # invalid UTF-8 in a string
        ((_enc("text"), _enc("x"), raw_map(_enc(1), _enc(2)), _enc(1)), ""),  # a map as a key: unhashable
        ((_enc("text"), _enc("x"), _enc("options"), raw_map(b"\xa1\xff", _enc(1))), ""),  # a bad key below
    ],
)
async def test_a_readable_id_always_gets_its_terminal_frame(extra: tuple[bytes, ...], fragment: str) -> None:
    with anyio.fail_after(20):
        async with sidecar("fake") as peer:
            await peer.send_raw(frame_of(raw_map(_enc("op"), _enc("synthesize"), _enc("id"), _enc(3), *extra)))
            error = await peer.expect(Error)
            assert (error.id, error.code) == (3, "invalid_message")
            assert fragment in error.message.lower()
            await assert_alive(peer, 4)


@pytest.mark.parametrize("bad_id", [-1, -(2**63), 2**63, 2**64 - 1])
async def test_ids_outside_the_range_are_rejected_not_echoed(bad_id: int) -> None:
    with anyio.fail_after(20):
        async with sidecar("fake") as peer:
            await peer.send_raw(frame_of(raw_map(_enc("op"), _enc("ping"), _enc("id"), _enc(bad_id))))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail["field"]) == (None, "invalid_message", "$.id")
            assert str(bad_id) in error.message
            await assert_alive(peer, protocol.MAX_ID)  # the largest id is fine


async def test_text_longer_than_the_limit_is_invalid_input() -> None:
    with anyio.fail_after(20):
        async with sidecar("fake", "--max-text", "10") as peer:
            await peer.send(Synthesize(id=1, text="x" * 11))
            error = await peer.expect(Error)
            assert (error.id, error.code, error.detail) == (1, "invalid_input", {"field": "$.text"})
            assert "11 characters" in error.message and "limit of 10" in error.message
            frames = await peer.request(Synthesize(id=2, text="y" * 10))
            assert pcm_of(frames) == render_bytes("y" * 10, 24000)
        async with fake_client() as client:  # the default: 100,000 characters
            with pytest.raises(InvalidRequestError) as caught:
                await client.synthesize("z" * 100_001)
            assert caught.value.code == "invalid_input" and caught.value.detail["field"] == "$.text"
