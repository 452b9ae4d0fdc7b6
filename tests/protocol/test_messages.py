"""The schema in protocol/messages.py: the request ops, and ids typed alike on every request."""

from __future__ import annotations

import anyio
import msgspec
import pytest
from harness import sidecar

from indextts_sidecar import protocol
from indextts_sidecar.protocol import MAX_ID, REQUEST_OPS, Error, Ping, Pong, Voices

#: Every request op docs/protocol.md lists.
DOCUMENTED_OPS = {"synthesize", "load", "unload", "ping", "cancel", "voices", "shutdown", "register_voice"}


def test_request_ops_are_the_documented_ones() -> None:
    assert REQUEST_OPS == DOCUMENTED_OPS


@pytest.mark.parametrize("op", sorted(DOCUMENTED_OPS))
def test_each_request_op_decodes_to_the_struct_of_that_tag(op: str) -> None:
    fields = {"synthesize": {"text": "a"}, "cancel": {"target": 1}, "register_voice": {"name": "n", "audio": b""}}
    body = msgspec.msgpack.encode({"op": op, "id": 9, **fields.get(op, {})})
    message = protocol.decode_request(body)
    assert message.__struct_config__.tag == op and message.id == 9


def test_synthesize_sends_stream_only_when_true_and_an_old_frame_decodes_as_not_streaming() -> None:
    plain = protocol.Synthesize(id=3, text="a")
    body = protocol.frame(plain)[4:]
    assert msgspec.msgpack.decode(body) == {"op": "synthesize", "id": 3, "text": "a"}  # as before the field
    assert protocol.decode_request(body) == plain and plain.stream is False
    streamed = protocol.frame(protocol.Synthesize(id=3, text="a", stream=True))[4:]
    assert msgspec.msgpack.decode(streamed) == {"op": "synthesize", "id": 3, "text": "a", "stream": True}
    decoded = protocol.decode_request(streamed)
    assert isinstance(decoded, protocol.Synthesize) and decoded.stream is True


def test_an_unknown_op_lists_the_request_ops() -> None:
    body = msgspec.msgpack.encode({"op": "sing", "id": 4})
    with pytest.raises(msgspec.ValidationError) as caught:
        protocol.decode_request(body)
    error = protocol.describe_invalid(body, caught.value)
    assert (error.code, error.id, error.detail) == ("unknown_op", 4, {"field": "$.op", "op": "sing"})
    assert str(sorted(DOCUMENTED_OPS)) in error.message


@pytest.mark.parametrize("bad_id", [-1, MAX_ID + 1])
def test_a_voices_id_is_a_request_id_like_every_other(bad_id: int) -> None:
    body = msgspec.msgpack.encode({"op": "voices", "id": bad_id})
    with pytest.raises(msgspec.ValidationError, match=r"\$\.id"):
        protocol.decode_request(body)
    ping = msgspec.msgpack.encode({"op": "ping", "id": bad_id})
    with pytest.raises(msgspec.ValidationError, match=r"\$\.id"):
        protocol.decode_request(ping)
    assert protocol.decode_request(msgspec.msgpack.encode({"op": "voices", "id": MAX_ID})) == Voices(id=MAX_ID)


@pytest.mark.anyio
async def test_a_sidecar_refuses_a_voices_id_out_of_range_and_stays_up() -> None:
    raw = msgspec.msgpack.encode({"op": "voices", "id": -1})
    with anyio.fail_after(10):
        async with sidecar("fake") as peer:
            await peer.send_raw(len(raw).to_bytes(4, "big") + raw)
            error = await peer.expect(Error)
            assert (error.code, error.id, error.detail) == ("invalid_message", None, {"field": "$.id"})
            assert f"request id -1 is outside 0..{MAX_ID}" in error.message
            answer = (await peer.request(Voices(id=3)))[-1]  # an id in range is served: fake has no named voices
            assert isinstance(answer, Error) and (answer.id, answer.code) == (3, "invalid_input")
            pong = await peer.request(Ping(id=4))
            assert isinstance(pong[-1], Pong) and pong[-1].id == 4


def test_a_word_span_is_a_four_array_on_the_wire_and_omitted_when_there_are_none() -> None:
    word = protocol.WordSpan(start_char=4, end_char=9, start=2400, end=5100)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(word)) == [4, 9, 2400, 5100]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(word), type=protocol.WordSpan) == word
    done = protocol.Done(id=1, samples=9000, chunks=2, sample_rate=24000, words=[word])
    body = protocol.frame(done)[4:]
    assert msgspec.msgpack.decode(body)["words"] == [[4, 9, 2400, 5100]]
    assert protocol.decode_reply(body) == done
    # An older peer's frames carry no ``words``: they decode to none, and none are sent as none.
    plain = protocol.frame(protocol.Done(id=1, samples=0, chunks=0, sample_rate=24000))[4:]
    assert "words" not in msgspec.msgpack.decode(plain)
    head, pcm = protocol.audio_frame_parts(7, 0, 24000, memoryview(b"\x01\x02\x03\x04"))
    assert "words" not in msgspec.msgpack.decode(bytes(head[4:]) + bytes(pcm))


def test_an_audio_frame_with_words_decodes_with_its_samples_intact() -> None:
    words = [protocol.WordSpan(0, 5, 0, 1200), protocol.WordSpan(6, 11, 1300, 2500)]
    pcm = bytes(range(256)) * 40
    head, samples = protocol.audio_frame_parts(7, 2, 24000, memoryview(pcm), words)
    assert samples.obj is pcm  # the samples travel uncopied, words or not
    audio = protocol.decode_reply(bytes(head[4:]) + bytes(samples))
    assert isinstance(audio, protocol.Audio)
    assert (audio.id, audio.seq, audio.sample_rate, audio.words) == (7, 2, 24000, words)
    assert bytes(audio.pcm) == pcm
