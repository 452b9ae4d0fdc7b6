"""The 64-level nesting limit, enforced when a request is decoded, the same on every Python.

msgspec's own limit follows the interpreter's recursion limit: on 3.10-3.12 it raises
RecursionError near 1,000 levels, on 3.13 it decodes thousands, so a request nested 65 to
1,000+ levels reached the engine, which refused its options as ``unknown_option``.
"""

from __future__ import annotations

import msgspec
import pytest

from indextts_sidecar.protocol import MAX_DEPTH, Synthesize, decode_request, describe_invalid, encode


def request_with_options_of_depth(total: int) -> bytes:
    """A synthesize request whose nesting is ``total`` levels: its map, the options map, then
    lists around nil, written byte by byte (an encoder may not go that deep)."""
    fields = [b"op", b"synthesize", b"id", 5, b"text", b"hi", b"options"]
    head = b"\x84" + b"".join(msgspec.msgpack.encode(f.decode() if isinstance(f, bytes) else f) for f in fields)
    return head + b"\x81" + msgspec.msgpack.encode("nested") + b"\x91" * (total - 2) + b"\xc0"


def test_a_request_of_exactly_the_limit_decodes() -> None:
    request = decode_request(request_with_options_of_depth(MAX_DEPTH))
    assert isinstance(request, Synthesize) and request.id == 5


@pytest.mark.parametrize("total", [MAX_DEPTH + 1, 100, 900, 1500, 5000])
def test_a_request_past_the_limit_is_invalid_message_at_decode(total: int) -> None:
    body = request_with_options_of_depth(total)
    with pytest.raises((msgspec.ValidationError, RecursionError)) as caught:
        decode_request(body)
    error = describe_invalid(body, caught.value)
    assert (error.code, error.id, error.detail) == ("invalid_message", 5, {"field": "$", "depth": total})
    assert f"nested {total} levels deep, more than {MAX_DEPTH}" in error.message


def test_keys_and_maps_count_as_levels_too() -> None:
    inner: object = None
    for _ in range(MAX_DEPTH - 1):
        inner = {"k": inner}
    body = encode(Synthesize(id=1, text="hi", options={"deep": inner}))  # 1 + 1 + 63 maps = 65
    assert decode_request(encode(Synthesize(id=1, text="hi", options={"deep": inner["k"]}))).id == 1  # type: ignore[index]
    with pytest.raises(msgspec.ValidationError):
        decode_request(body)
