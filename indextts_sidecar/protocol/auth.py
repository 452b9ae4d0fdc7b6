"""The socket transport's challenge-response handshake (see docs/protocol.md, "Sockets").

The sidecar sends a ``challenge`` frame holding a fresh random nonce; the parent
answers with an ``auth`` frame holding HMAC-SHA256(token, context || nonce).  The
token itself never crosses the wire, a recorded answer is useless against the next
nonce, and the sidecar compares in constant time.  Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any, Union

__all__ = ["CONTEXT", "METHOD", "NONCE_BYTES", "answer", "challenge", "load_token", "verify"]

METHOD = "hmac-sha256"
#: Bound into every MAC, so an answer cannot be replayed into another protocol's exchange.
CONTEXT = b"indextts-sidecar auth v1\0"
NONCE_BYTES = 32
#: Shortest token accepted: 128 bits of secret.
MIN_TOKEN_BYTES = 16


def load_token(path: str) -> bytes:
    """The token in file ``path`` (surrounding whitespace stripped); ValueError when unusable."""
    with open(path, "rb") as f:
        token = f.read().strip()
    if len(token) < MIN_TOKEN_BYTES:
        raise ValueError(f"the token in {path!r} is shorter than {MIN_TOKEN_BYTES} bytes")
    return token


def challenge() -> dict[str, Any]:
    """A new ``challenge`` message (a plain map: it precedes protocol v1's ``ready``)."""
    return {"op": "challenge", "method": METHOD, "nonce": os.urandom(NONCE_BYTES)}


def answer(token: Union[str, bytes], nonce: bytes) -> bytes:
    """The MAC a parent holding ``token`` sends for ``nonce``."""
    key = token.encode() if isinstance(token, str) else token
    return hmac.new(key, CONTEXT + nonce, hashlib.sha256).digest()


def verify(token: bytes, nonce: bytes, mac: object) -> bool:
    """Whether ``mac`` answers ``nonce`` for ``token``; constant time in the MAC's content."""
    if not isinstance(mac, (bytes, bytearray)):
        return False
    return hmac.compare_digest(answer(token, nonce), bytes(mac))
