"""One request id's exchange (``indextts_client._wire._exchange``): its state, its audio, and the request encoding.

Pure: frames are handed to the exchange as the connection's reader would, without a connection.
"""

from __future__ import annotations

import typing
from typing import Any

import anyio
import numpy as np
import pytest

from indextts_client import InvalidRequestError, ProtocolError
from indextts_client._wire._exchange import ABANDONED, ENDED, REGISTERED, SENT, TERMINAL_KINDS, Exchange, encode_request
from indextts_sidecar import protocol

RATE = 8000


def _exchange(request_id: int = 5) -> Exchange:
    return Exchange(request_id, 0.0, anyio.Event)


def _audio(seq: int, *samples: int, request_id: int = 5, rate: int = RATE) -> protocol.Audio:
    pcm = memoryview(np.array(samples, dtype="<i2").tobytes())
    return protocol.Audio(id=request_id, seq=seq, sample_rate=rate, pcm=pcm)


def _done(samples: int, chunks: int, request_id: int = 5) -> protocol.Done:
    return protocol.Done(id=request_id, samples=samples, chunks=chunks, sample_rate=RATE)


def _never_shared(pcm: memoryview) -> bool:
    return False


# ------------------------------------------------------------------------- state


def test_an_exchange_goes_registered_sent_ended() -> None:
    exchange = _exchange()
    assert exchange.state is REGISTERED
    exchange.mark_sent()
    assert exchange.state is SENT
    exchange.receive(_done(0, 0), 1.0, True, _never_shared)
    assert exchange.state is ENDED and exchange.last_frame == 1.0
    assert [type(item) for item in exchange.items] == [protocol.Done]


def test_a_terminal_frame_read_before_the_write_returned_is_not_undone_by_it() -> None:
    # The slow path writes under an await: the reader may route the answer first.
    exchange = _exchange()
    exchange.receive(protocol.Pong(id=5, loaded=False, queue_depth=0), 1.0, True, _never_shared)
    exchange.mark_sent()
    assert exchange.state is ENDED


def test_a_failure_before_the_write_leaves_it_registered_with_the_error() -> None:
    exchange = _exchange()
    error = ProtocolError("gone")
    exchange.fail(error)
    assert exchange.state is REGISTERED and exchange.error is error
    sent = _exchange(6)
    sent.mark_sent()
    sent.fail(error)
    assert sent.state is ENDED and sent.error is error


def test_an_abandoned_exchange_drops_what_waits_and_what_comes_and_stays_abandoned() -> None:
    exchange = _exchange()
    exchange.mark_sent()
    exchange.receive(_audio(0, 1, 2, 3), 1.0, False, _never_shared)
    assert exchange.buffered == 6
    assert exchange.abandon() is SENT
    assert exchange.state is ABANDONED and not exchange.items and exchange.buffered == 0
    exchange.receive(_audio(1, 4), 2.0, False, _never_shared)
    exchange.receive(protocol.Error(id=5, code="cancelled", message="cancelled"), 3.0, True, _never_shared)
    assert exchange.state is ABANDONED and not exchange.items and exchange.buffered == 0
    assert exchange.last_frame == 3.0
    assert exchange.abandon() is ABANDONED


# ------------------------------------------------------------------------- audio


def test_buffered_audio_rises_as_frames_arrive_and_falls_as_they_are_read() -> None:
    exchange = _exchange()
    exchange.mark_sent()
    exchange.receive(_audio(0, 1, 2, 3), 1.0, False, _never_shared)
    exchange.receive(protocol.Progress(id=5, stage="synthesize", fraction=0.5), 1.5, False, _never_shared)
    exchange.receive(_audio(1, 4, 5), 2.0, False, _never_shared)
    assert exchange.buffered == 10
    first = exchange.next_item()
    assert isinstance(first, protocol.Audio) and bytes(first.pcm) == np.array([1, 2, 3], "<i2").tobytes()
    assert exchange.buffered == 4
    assert isinstance(exchange.next_item(), protocol.Progress) and exchange.buffered == 4
    assert isinstance(exchange.next_item(), protocol.Audio) and exchange.buffered == 0
    assert exchange.next_item() is None


def test_audio_in_the_readers_buffer_is_copied_before_it_is_queued() -> None:
    exchange = _exchange()
    raw = bytearray(np.array([7, 8], "<i2").tobytes())
    view = memoryview(raw)
    exchange.receive(protocol.Audio(id=5, seq=0, sample_rate=RATE, pcm=view), 1.0, False, lambda pcm: pcm.obj is raw)
    raw[:] = b"\x00" * len(raw)  # the reader reads the next frame over it
    item = exchange.next_item()
    assert isinstance(item, protocol.Audio) and bytes(item.pcm) == np.array([7, 8], "<i2").tobytes()


def test_progress_nobody_listens_to_is_counted_not_queued() -> None:
    exchange = _exchange()
    exchange.progress_wanted = False
    exchange.receive(protocol.Progress(id=5, stage="synthesize", fraction=0.5), 1.0, False, _never_shared)
    assert not exchange.items and exchange.taken_by_reader == 1 and exchange.last_frame == 1.0


def test_assembled_audio_never_waits_in_the_inbox() -> None:
    exchange = _exchange()
    assembler = exchange.assemble_audio()
    exchange.receive(_audio(0, 1, 2), 1.0, False, _never_shared)
    exchange.receive(_audio(1, 3), 2.0, False, _never_shared)
    assert not exchange.items and exchange.buffered == 0 and exchange.taken_by_reader == 2
    exchange.receive(_done(3, 2), 3.0, True, _never_shared)
    assert [type(item) for item in exchange.items] == [protocol.Done]
    assembler.check_done(3, 2, RATE)
    assert assembler.assemble().tolist() == [1, 2, 3]


def test_a_bad_assembled_frame_fails_the_exchange_after_the_frames_before_it() -> None:
    exchange = _exchange()
    exchange.assemble_audio()
    exchange.receive(protocol.Progress(id=5, stage="synthesize", fraction=0.1), 1.0, False, _never_shared)
    exchange.receive(_audio(0, 1), 2.0, False, _never_shared)
    exchange.receive(_audio(2, 2), 3.0, False, _never_shared)  # seq 1 is missing
    exchange.receive(_done(2, 2), 4.0, True, _never_shared)
    assert isinstance(exchange.error, ProtocolError)
    assert "seq 2 arrived, expected 1" in exchange.error.message
    assert exchange.assembly_error is exchange.error
    # What came before the bad frame is still read first; what came after is dropped.
    assert [type(item) for item in exchange.items] == [protocol.Progress]


# ---------------------------------------------------------------------- encoding


def test_encode_request_gives_the_frame_of_the_message() -> None:
    message = protocol.Synthesize(id=3, text="hello", options={"seconds": 0.5})
    data = encode_request(message, protocol.DEFAULT_MAX_FRAME_SIZE)
    assert int.from_bytes(data[: protocol.HEADER], "big") == len(data) - protocol.HEADER
    assert protocol.decode_request(data[protocol.HEADER :]) == message


def test_encode_request_refuses_an_option_that_cannot_be_encoded() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        encode_request(protocol.Synthesize(id=4, text="x", options={"bad": object()}), 1 << 20)
    assert caught.value.code == "invalid_option" and caught.value.request_id == 4
    assert caught.value.message.startswith("the request cannot be encoded")


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_encode_request_refuses_options_nested_deeper_than_a_sidecar_must_accept() -> None:
    fits = protocol.Synthesize(id=8, text="x", options={"deep": _nested(protocol.MAX_DEPTH - 3)})
    encode_request(fits, 1 << 20)
    with pytest.raises(InvalidRequestError) as caught:
        encode_request(protocol.Synthesize(id=9, text="x", options={"deep": _nested(protocol.MAX_DEPTH)}), 1 << 20)
    error = caught.value
    assert error.code == "invalid_option" and error.request_id == 9
    assert error.detail["field"] == "$" and error.detail["depth"] > protocol.MAX_DEPTH


def test_encode_request_refuses_a_frame_over_the_sidecars_max_frame_size() -> None:
    message = protocol.Synthesize(id=2, text="x" * 200)
    size = len(protocol.frame(message)) - protocol.HEADER
    assert encode_request(message, size) == protocol.frame(message)
    with pytest.raises(InvalidRequestError) as caught:
        encode_request(message, size - 1)
    error = caught.value
    assert error.code == "invalid_input" and error.request_id == 2
    assert error.message == f"the request takes {size} bytes, more than the sidecar's max_frame_size of {size - 1}"


def test_the_readers_terminal_kinds_are_the_protocols_terminal_replies() -> None:
    # The reader tells a terminal frame by its type alone (the frames with an id); it must agree with the protocol.
    replies: list[protocol.Reply] = [
        protocol.Progress(id=1, stage="synthesize", fraction=0.5),
        _audio(0, 1, request_id=1),
        _done(1, 1, request_id=1),
        protocol.Ok(id=1),
        protocol.Pong(id=1, loaded=True, queue_depth=0, active=None, uptime=0.0),
        protocol.Error(code="busy", message="full", id=1),
    ]
    assert {type(reply) for reply in replies} == set(typing.get_args(protocol.Reply)) - {protocol.Ready}
    for reply in replies:
        assert (type(reply) in TERMINAL_KINDS) == protocol.is_terminal(reply), reply
