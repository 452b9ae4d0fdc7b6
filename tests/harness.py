"""A minimal parent of our own for the sidecar tests.

It spawns ``python -m indextts_sidecar`` and speaks the protocol with nothing but the
protocol module and anyio: the frame reader below is deliberately separate from the
one in ``indextts_sidecar.protocol.framing`` so the tests check the wire, not our reader.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import types
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Union

import anyio
from anyio.abc import ByteReceiveStream, Process

from indextts_sidecar import protocol

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Stand-in ``indextts`` packages (one folder per flavour) and a torch stub.
STANDIN = Path(REPO) / "tests" / "standin"


def make_checkpoints(root: Path, *, skip: tuple[str, ...] = (), hf_cache: bool = True, version: str = "2") -> Path:
    """An IndexTTS checkpoint folder of placeholder files, without those named in ``skip``.

    ``version`` ("2" or "2.5") picks the file list and the config's ``version``;
    ``hf_cache`` adds the auxiliary models upstream would otherwise download.
    """
    from indextts_sidecar.engines.indextts import (
        AUX_FILES,
        AUX_FILES_25,
        CHECKPOINT_FILES,
        CHECKPOINT_FILES_25,
        QWEN_EMO_DIR,
    )

    root.mkdir(parents=True, exist_ok=True)
    files = CHECKPOINT_FILES_25 if version == "2.5" else CHECKPOINT_FILES
    if hf_cache:
        files = files + (AUX_FILES_25 if version == "2.5" else AUX_FILES)
    for name in files:
        if name not in skip:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"stand-in")
    if "config.yaml" not in skip:
        (root / "config.yaml").write_text(f"# stand-in\nversion: {'2.5' if version == '2.5' else '2.0'}\n")
    if f"{QWEN_EMO_DIR}/" not in skip:
        (root / QWEN_EMO_DIR).mkdir(exist_ok=True)
    return root


def sidecar_command(engine: str = "fake", *args: str) -> list[str]:
    return [sys.executable, "-m", "indextts_sidecar", "--engine", engine, "--log-level", "WARNING", *args]


class Peer:
    """One spawned sidecar and the parent's ends of its pipes."""

    def __init__(self, process: Process, stderr_path: str) -> None:
        self.process = process
        self.stderr_path = stderr_path
        self._buffer = bytearray()
        assert process.stdin is not None and process.stdout is not None
        self.stdin = process.stdin
        self.stdout = process.stdout

    async def send(self, message: protocol.Request) -> None:
        await self.stdin.send(protocol.frame(message))

    async def send_raw(self, data: bytes) -> None:
        await self.stdin.send(data)

    async def _fill(self, size: int) -> bool:
        while len(self._buffer) < size:
            try:
                self._buffer += await self.stdout.receive()
            except anyio.EndOfStream:
                return False
        return True

    async def reply(self) -> protocol.Reply:
        """The next frame, which must exist: the end of the stream fails with the sidecar's stderr."""
        reply = await self.recv()
        assert reply is not None, f"the sidecar closed its stdout; stderr:\n{self.stderr()}"
        return reply

    async def request(self, message: protocol.Request) -> list[protocol.Reply]:
        """Send ``message``; its frames up to and including its terminal one."""
        await self.send(message)
        return await self.until_terminal(message.id)

    async def recv(self) -> Union[protocol.Reply, None]:
        """The next frame from the sidecar, or None at end of stream."""
        if not await self._fill(4):
            assert not self._buffer, f"stream ended inside a length prefix: {bytes(self._buffer)!r}"
            return None
        size = int.from_bytes(self._buffer[:4], "big")
        assert await self._fill(4 + size), "stream ended inside a frame"
        body = bytes(self._buffer[4 : 4 + size])
        del self._buffer[: 4 + size]
        return protocol.decode_reply(body)

    async def expect(self, kind: type[Any]) -> Any:
        """The next frame, which must be a ``kind``; progress frames before it are skipped."""
        reply = await self.recv()
        while isinstance(reply, protocol.Progress) and kind is not protocol.Progress:
            reply = await self.recv()
        assert isinstance(reply, kind), f"expected {kind.__name__}, got {reply!r}"
        return reply

    async def until_terminal(self, request_id: int) -> list[protocol.Reply]:
        """Frames up to and including ``request_id``'s terminal one; others for it are kept too."""
        frames: list[protocol.Reply] = []
        while True:
            reply = await self.recv()
            assert reply is not None, f"stream ended before request {request_id} finished; got {frames!r}"
            frames.append(reply)
            if protocol.is_terminal(reply) and getattr(reply, "id", None) == request_id:
                return frames

    async def collect(self, ids: set[int]) -> dict[int, list[protocol.Reply]]:
        """Frames per id until every id in ``ids`` has its terminal frame."""
        per_id: dict[int, list[protocol.Reply]] = {}
        open_ids = set(ids)
        while open_ids:
            reply = await self.recv()
            assert reply is not None, f"stream ended with requests {sorted(open_ids)} open"
            request_id = getattr(reply, "id", None)
            assert request_id is not None, f"unexpected connection-level frame {reply!r}"
            per_id.setdefault(request_id, []).append(reply)
            if protocol.is_terminal(reply):
                assert request_id in open_ids, f"second terminal frame for {request_id}: {reply!r}"
                open_ids.discard(request_id)
        return per_id

    def stderr(self) -> str:
        with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
            return f.read()


def pcm_of(frames: Sequence[protocol.Reply]) -> bytes:
    """The audio of one request's frames, checking the sequence numbers."""
    audio = [f for f in frames if isinstance(f, protocol.Audio)]
    assert [a.seq for a in audio] == list(range(len(audio))), "audio frames out of sequence"
    return b"".join(bytes(a.pcm) for a in audio)


@asynccontextmanager
async def spawn(
    engine: str = "fake",
    *args: str,
    env: Union[dict[str, str], None] = None,
    pythonpath: Sequence[str] = (),
    peer_class: type[Peer] = Peer,
) -> AsyncIterator[Any]:
    """Spawn a sidecar, read nothing yet; kill and reap it on the way out.

    ``pythonpath`` folders come first on the child's path; ``env`` is added last.
    """
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("INDEXTTS_STANDIN_")}
    full_env["PYTHONPATH"] = os.pathsep.join([*pythonpath, REPO, full_env.get("PYTHONPATH", "")])
    if env:
        full_env.update(env)
    fd, stderr_path = tempfile.mkstemp(prefix="sidecar-stderr-", suffix=".log")
    try:
        process = await anyio.open_process(
            sidecar_command(engine, *args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fd, env=full_env
        )
        os.close(fd)
        fd = -1
        peer = peer_class(process, stderr_path)
        try:
            yield peer
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                await process.wait()
                await process.aclose()
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(stderr_path)


@asynccontextmanager
async def sidecar(engine: str = "fake", *args: str, env: Union[dict[str, str], None] = None) -> AsyncIterator[Peer]:
    """Spawn a sidecar and read its ``ready`` frame."""
    async with spawn(engine, *args, env=env) as peer:
        await peer.expect(protocol.Ready)
        yield peer


async def two_pids(stream: ByteReceiveStream) -> tuple[int, int]:
    """The line ``FIRST_PID SECOND_PID`` a test's parent script writes once both processes are up."""
    line = b""
    while not line.endswith(b"\n"):
        line += await stream.receive()
    first, second = map(int, line.split())
    return first, second


@asynccontextmanager
async def listening_process(
    command: Sequence[str], *, stderr: Any, env: Union[dict[str, str], None] = None
) -> AsyncIterator[tuple[Process, str]]:
    """A sidecar started with ``--listen``: yields it and the address of its ``listening on`` line.

    The line must come within 60 s. On the way out the process is terminated (killed after 10 s)
    and reaped, shielded from cancellation."""
    process = await anyio.open_process(
        list(command), stdin=subprocess.DEVNULL, stderr=stderr, env={**os.environ, **env} if env else None
    )
    try:
        assert process.stdout is not None
        line = b""
        with anyio.fail_after(60):
            while not line.endswith(b"\n"):
                line += await process.stdout.receive(1)
        text = line.decode().strip()
        assert text.startswith("listening on "), text
        yield process, text.removeprefix("listening on ")
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(10):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()


@asynccontextmanager
async def listening_unix(directory: Path, engine: str = "fake", *args: str) -> AsyncIterator[Path]:
    """A sidecar listening on a Unix socket in ``directory`` (no token); yields the socket's path.

    Its stderr goes to ``directory / "sidecar.log"``; see :func:`listening_process`."""
    path = directory / "s.sock"
    with open(directory / "sidecar.log", "ab") as log:
        async with listening_process([*sidecar_command(engine, *args), "--listen", f"unix://{path}"], stderr=log):
            yield path


@asynccontextmanager
async def unix_peer(path: Path, directory: Path) -> AsyncIterator[tuple[Peer, protocol.Ready]]:
    """A connection to the sidecar of :func:`listening_unix`, and its ``ready`` frame."""
    stream = await anyio.connect_unix(str(path))
    async with stream:
        peer = Peer(types.SimpleNamespace(stdin=stream, stdout=stream), str(directory / "sidecar.log"))  # type: ignore[arg-type]
        ready = await peer.expect(protocol.Ready)
        yield peer, ready
