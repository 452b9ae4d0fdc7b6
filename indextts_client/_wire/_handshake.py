"""The start and the end of a connection: the handshake, and why a connection ended.

:func:`handshake` reads frames until the sidecar's ``ready`` (answering a socket
transport's challenge on the way).  The rest are pure functions over what the reader saw:
:func:`read_ready` checks the first frame (the ``ready``, or the sidecar's reason for not
starting); :func:`error_for_loss` turns why the reader stopped, plus what the owner knows
of the process, into the typed error every pending request fails with.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Union

import msgspec

from indextts_sidecar import protocol
from indextts_sidecar.protocol import auth
from indextts_sidecar.protocol.framing import FrameReader

from .._exceptions import (
    AuthenticationError,
    CrashedError,
    ProtocolError,
    SidecarError,
    StartError,
    VersionMismatchError,
    describe_exit,
)

__all__ = ["Loss", "LossInfo", "answer_challenge", "challenge_of", "error_for_loss", "handshake", "read_ready"]

#: Writes one whole frame outside any request; returns what failed, else None.
SendRaw = Callable[[bytes], Awaitable[Union[str, None]]]


@dataclass(frozen=True)
class LossInfo:
    """What an owner knows about why a connection ended (see ``describe_loss``)."""

    exit_code: Union[int, None] = None
    signal: Union[int, None] = None
    stderr_tail: str = ""


@dataclass
class Loss:
    """Why the reader stopped: ``eof``, ``aborted``, ``framing``, ``protocol``, ``version``, ``startup_error``."""

    kind: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)


def challenge_of(body: memoryview) -> Union[dict[str, Any], None]:
    """The socket transport's ``challenge`` message, if ``body`` is one."""
    try:
        loose = msgspec.msgpack.decode(body)
    except msgspec.MsgspecError:
        return None
    if isinstance(loose, dict) and loose.get("op") == "challenge":
        return loose
    return None


async def handshake(
    reader: FrameReader, *, token: Union[bytes, str, None], send_raw: SendRaw, redact: Callable[[str], str]
) -> Union[protocol.Ready, Loss]:
    """Read frames until the sidecar's ``ready``: the ``ready``, or why there is none.

    A socket transport may first send a ``challenge``, answered once with ``token``'s proof;
    framing errors of the reader propagate.
    """
    challenged = False
    while True:
        body = await reader.receive()
        if body is None:
            return Loss("eof", "the sidecar's output stream ended")
        if not challenged:
            challenge = challenge_of(body)
            if challenge is not None:
                challenged = True
                loss = await answer_challenge(challenge, token, send_raw)
                if loss is not None:
                    return loss
                continue
        return read_ready(body, redact)


async def answer_challenge(
    challenge: dict[str, Any], token: Union[bytes, str, None], send_raw: SendRaw
) -> Union[Loss, None]:
    """Prove we hold the token (socket transport); the token itself is never sent."""
    nonce = challenge.get("nonce")
    if challenge.get("method") != auth.METHOD or not isinstance(nonce, bytes):
        return Loss("protocol", f"the sidecar's challenge is not one this client answers: {challenge!r}")
    if token is None:
        return Loss("auth", "the sidecar requires a token, and none was given (token=...)")
    mac = auth.answer(token, nonce)
    body = msgspec.msgpack.encode({"op": "auth", "mac": mac})
    failure = await send_raw(len(body).to_bytes(protocol.HEADER, "big") + body)
    if failure is not None:
        return Loss("eof", f"sending the token's proof failed: {failure}")
    return None


def read_ready(body: memoryview, redact: Callable[[str], str]) -> Union[protocol.Ready, Loss]:
    """The sidecar's first frame: its ``ready``, or why there is none."""
    try:
        loose = msgspec.msgpack.decode(body)
    except msgspec.MsgspecError:
        loose = None
    if not isinstance(loose, dict) or not isinstance(loose.get("op"), str):
        return Loss(
            "protocol",
            f"the sidecar's first frame is not a protocol message (did something write to its stdout?): "
            f"{bytes(body[:48])!r}",
        )
    op = loose["op"]
    if op == "error" and loose.get("id") is None:
        code = str(loose.get("code", "internal"))
        message = redact(str(loose.get("message", "")))
        if code == "tls_required":  # a TLS listener answering a plain connection
            return Loss("startup_error", f"the sidecar expects TLS: {message}", {"code": code})
        return Loss("startup_error", f"the sidecar failed to start: {code}: {message}", {"code": code})
    if op != "ready":
        return Loss("protocol", f"the sidecar's first frame is {op!r}, expected 'ready'")
    got = loose.get("protocol")
    if got != protocol.PROTOCOL_VERSION:
        return Loss(
            "version",
            f"the sidecar speaks protocol version {got!r}, this client speaks version {protocol.PROTOCOL_VERSION}",
            {"got": got},
        )
    try:
        ready = protocol.decode_reply(body)
    except msgspec.MsgspecError as exc:
        return Loss("protocol", f"the sidecar's 'ready' frame is invalid: {exc}")
    assert isinstance(ready, protocol.Ready)
    return ready


def error_for_loss(loss: Loss, info: LossInfo, *, handshaken: bool, fatal: Union[str, None]) -> SidecarError:
    """The error pending requests fail with; ``fatal``: what the sidecar said of lost framing."""
    message = loss.message
    if fatal is not None:
        message += f"; the sidecar reported: {fatal}"
    exit_text = describe_exit(info.exit_code, info.signal)
    if not handshaken:
        if loss.kind == "auth":
            return AuthenticationError(message, code="unauthorized")
        if loss.extra.get("code") == "unauthorized":
            return AuthenticationError("the sidecar refused the token (wrong token)", code="unauthorized")
        if loss.kind == "version":
            return VersionMismatchError(
                message,
                expected=protocol.PROTOCOL_VERSION,
                got=loss.extra.get("got"),
                exit_code=info.exit_code,
                signal=info.signal,
                stderr_tail=info.stderr_tail,
            )
        if info.exit_code is not None or info.signal is not None:
            message += f"; the sidecar {exit_text}"
        if loss.kind != "startup_error":
            message = f"the sidecar failed before 'ready': {message}"
        return StartError(
            message,
            exit_code=info.exit_code,
            signal=info.signal,
            stderr_tail=info.stderr_tail,
            code=loss.extra.get("code"),
        )
    if loss.kind in ("framing", "protocol"):
        return ProtocolError(message, stderr_tail=info.stderr_tail)
    if info.exit_code is not None or info.signal is not None:
        message = f"the sidecar {exit_text}" if loss.kind == "eof" else f"the sidecar {exit_text} ({message})"
    return CrashedError(message, exit_code=info.exit_code, signal=info.signal, stderr_tail=info.stderr_tail)
