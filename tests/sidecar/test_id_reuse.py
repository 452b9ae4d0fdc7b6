"""Ids are reusable the moment their terminal frame can be read (docs/protocol.md).

A parent keeps a few ids in flight and re-sends each one the instant its terminal frame
arrives, 2,000 times per sidecar kind (plain, fixed batches, joining batches), over a pipe and
over a Unix socket: no reuse may be refused (``duplicate_id``), and every request ends ``done``
with its own audio.  The sidecar queued a terminal frame before its id left the live set, so
the reader sometimes still found the id in flight a fraction of a millisecond after the parent
had read that frame (2 of 260 on a plain sidecar before the fix).

A refusal that concerns an id carries it: ``duplicate_id`` names the id in ``detail.id`` (its
``id`` field stays empty, so the live request gets no second terminal frame).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from harness import Peer, listening_unix, sidecar, unix_peer

from indextts_sidecar import protocol
from indextts_sidecar.engines.fake import render_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

RATE = 8000
TEXT = "ab"
ROUNDS = 2000
KINDS = {
    "plain": [],
    "batches": ["-o", "max_batch=4"],
    "joining": ["-o", "max_batch=4", "-o", "join_batches=true"],
}


def _request(request_id: int) -> protocol.Synthesize:
    return protocol.Synthesize(id=request_id, text=TEXT, progress=False)


async def _reuse(peer: Peer, ids: int) -> None:
    """``ROUNDS`` terminals, each id sent again the moment its terminal is read."""
    expected = render_bytes(TEXT, RATE)
    audio: dict[int, bytearray] = {i: bytearray() for i in range(ids)}
    for request_id in range(ids):
        await peer.send(_request(request_id))
    ended = 0
    with anyio.fail_after(180):
        while ended < ROUNDS:
            reply = await peer.reply()
            request_id = getattr(reply, "id", None)
            assert not isinstance(reply, protocol.Error), f"after {ended} terminals: {reply!r}"
            assert request_id is not None, reply
            if isinstance(reply, protocol.Audio):
                audio[request_id] += reply.pcm
                continue
            if isinstance(reply, protocol.Progress):  # the first request's load
                continue
            assert isinstance(reply, protocol.Done), reply
            assert bytes(audio[request_id]) == expected, f"request {request_id}'s audio after {ended} terminals"
            audio[request_id].clear()
            ended += 1
            await peer.send(_request(request_id))  # at once: the id has ended
        # The ids still in flight end too, with nothing refused.
        open_ids = set(range(ids))
        while open_ids:
            reply = await peer.reply()
            assert not isinstance(reply, protocol.Error), reply
            if isinstance(reply, protocol.Done):
                open_ids.discard(reply.id)


@pytest.mark.parametrize("kind", list(KINDS))
async def test_an_id_is_reusable_once_its_terminal_frame_is_read_over_a_pipe(kind: str) -> None:
    async with sidecar("fake", "-o", f"sample_rate={RATE}", *KINDS[kind]) as peer:
        await _reuse(peer, ids=4)


@pytest.mark.parametrize("kind", list(KINDS))
async def test_an_id_is_reusable_once_its_terminal_frame_is_read_over_a_socket(kind: str, sockdir: Path) -> None:
    async with (
        listening_unix(sockdir, "fake", "-o", f"sample_rate={RATE}", *KINDS[kind]) as path,
        unix_peer(path, sockdir) as (peer, _),
    ):
        await _reuse(peer, ids=4)


async def test_a_duplicate_id_refusal_names_the_id() -> None:
    async with sidecar("fake", "-o", f"sample_rate={RATE}") as peer:
        await peer.send(protocol.Synthesize(id=7, text="a long one " * 20, options={"delay": 0.05}))
        await peer.send(protocol.Ping(id=7))
        reply = await peer.reply()
        while not isinstance(reply, protocol.Error):
            reply = await peer.reply()
        assert (reply.code, reply.id, reply.detail) == ("duplicate_id", None, {"field": "$.id", "id": 7})
        await peer.send(protocol.Cancel(id=8, target=7))
        frames = await peer.collect({7, 8})
        assert isinstance(frames[7][-1], protocol.Error) and frames[7][-1].code == "cancelled"
