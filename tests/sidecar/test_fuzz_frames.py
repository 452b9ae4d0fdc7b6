"""A bounded fuzz of whole frames: every readable id gets exactly one terminal frame.

Each example is a stream of request frames, some well-formed, most not: invalid UTF-8 in
strings, maps used as keys, nesting thousands of levels deep, ids out of range or of the
wrong type, unknown ops, random bytes. The stream goes to a real sidecar, then the input
ends. The expected ids are planted by the generator, not computed by the code under test.
"""

from __future__ import annotations

import subprocess
from typing import Union

import msgspec
from harness import REPO, sidecar_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indextts_sidecar import protocol

_enc = msgspec.msgpack.encode


def _map(pairs: list[tuple[bytes, bytes]]) -> bytes:
    head = bytes([0x80 | len(pairs)]) if len(pairs) < 16 else b"\xde" + len(pairs).to_bytes(2, "big")
    return head + b"".join(key + value for key, value in pairs)


def _bad_utf8(raw: bytes) -> bytes:
    """A msgpack str (str 8) whose bytes are not UTF-8."""
    data = b"\xff" + raw  # 0xff never occurs in UTF-8
    return b"\xd9" + bytes([len(data)]) + data


def _deep(depth: int, kind: int) -> bytes:
    step = (b"\x91", b"\x81\xa1k", b"\x81\x91\x01")[kind]  # lists, maps, lists as keys (hashable once decoded)
    return step * depth + b"\xc0"


#: Encoded values a field may hold, valid or not.
values = st.one_of(
    st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=12), st.booleans(), st.none(), st.floats()).map(_enc),
    st.binary(max_size=6).map(_bad_utf8),
    st.tuples(st.integers(1, 3000), st.integers(0, 2)).map(lambda t: _deep(*t)),
    st.just(b"\x81\x81\x01\x02\x03"),  # a map whose key is a map: unhashable
    st.just(b"\xd4\x01\x00"),  # an ext type
)
texts = st.one_of(st.text(min_size=1, max_size=8).map(_enc), st.binary(max_size=6).map(_bad_utf8), values)
ops = st.one_of(
    st.sampled_from(["synthesize", "synthesize", "ping", "cancel", "load", "unload"]).map(_enc),
    st.sampled_from(["bogus", ""]).map(_enc),
    st.binary(max_size=4).map(_bad_utf8),
    st.integers(0, 5).map(_enc),
)
#: How the id appears: well (readable), or not at all / out of range / of the wrong type.
id_kinds = st.sampled_from(["ok", "ok", "ok", "missing", "negative", "huge", "string", "float"])


@st.composite
def frames(draw: st.DrawFn, request_id: int) -> tuple[bytes, Union[int, None]]:
    if draw(st.integers(0, 9)) == 0:  # random bytes: no readable id
        return draw(st.binary(max_size=40)), None
    pairs: list[tuple[bytes, bytes]] = [(_enc("op"), draw(ops))]
    kind = draw(id_kinds)
    planted: Union[int, None] = None
    if kind == "ok":
        pairs.append((_enc("id"), _enc(request_id)))
        planted = request_id
    elif kind != "missing":
        bad = {"negative": -request_id - 1, "huge": 2**63 + request_id, "string": str(request_id), "float": 1.5}
        pairs.append((_enc("id"), _enc(bad[kind])))
    for name in draw(st.lists(st.sampled_from(["text", "target", "options", "voice", "extra"]), max_size=4)):
        value = draw(texts if name == "text" else values)
        if name == "options" and draw(st.booleans()):
            value = _map([(_enc("nested"), draw(values))])
        pairs.append((_enc(name), value))
    if draw(st.integers(0, 4)) == 0:
        pairs.append((_enc(7), _enc("an int key")))
    order = draw(st.permutations(range(len(pairs))))
    return _map([pairs[i] for i in order]), planted


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], set[int]]:
    base = draw(st.integers(0, protocol.MAX_ID - 100))
    count = draw(st.integers(1, 12))
    bodies, planted = [], set()
    for i in range(count):
        body, request_id = draw(frames(base + i))
        bodies.append(body)
        if request_id is not None:
            planted.add(request_id)
    return bodies, planted


def _frames(data: bytes) -> list[protocol.Reply]:
    out, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        out.append(protocol.decode_reply(data[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(streams())
def test_every_readable_id_gets_exactly_one_terminal_frame(stream: tuple[list[bytes], set[int]]) -> None:
    bodies, planted = stream
    data = b"".join(len(body).to_bytes(4, "big") + body for body in bodies)
    result = subprocess.run(sidecar_command("fake"), input=data, capture_output=True, cwd=REPO, timeout=60, check=False)
    replies = _frames(result.stdout)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert isinstance(replies[0], protocol.Ready)
    terminal = [reply.id for reply in replies if protocol.is_terminal(reply)]  # type: ignore[union-attr]
    assert sorted(terminal) == sorted(planted), (terminal, planted)
    assert not any(isinstance(r, protocol.Error) and r.code == "duplicate_id" for r in replies)
    assert "Traceback" not in result.stderr.decode(errors="replace")


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=20,
)


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@given(st.integers(0, protocol.MAX_ID), st.text(max_size=20), st.dictionaries(st.text(max_size=4), json_values))
def test_peek_reads_what_the_decoder_reads(request_id: int, text: str, options: dict[str, object]) -> None:
    body = protocol.encode(protocol.Synthesize(id=request_id, text=text, options=options))
    peeked = protocol.peek(body)
    assert (peeked.is_map, peeked.op, peeked.has_op, peeked.id, peeked.raw_id) == (
        True, "synthesize", True, request_id, request_id
    )  # fmt: skip
    # The top-level map is level 1; options, when present (not empty), add their own depth.
    assert peeked.depth == 1 + (_depth(options) if options else 0)
    # Cut short anywhere, a message never makes peek raise.
    for cut in range(len(body)):
        protocol.peek(body[:cut])
