"""The sidecar child process: spawn, stderr drain, exit facts, and the stop ladder.

* The child is spawned with ``start_new_session=True``: it leads its own process group
  (signals go to the group, so its helpers die with it) and the user's Ctrl-C in the
  terminal does not reach it.
* stderr is always drained, so a chatty child never blocks on a full pipe.  Each line
  (over-long ones are split) is forwarded to the ``indextts_client.sidecar`` logger and
  the last lines are kept for error messages; secrets are redacted on the way.
* :func:`stop_sidecar` is the whole stop ladder, bounded and shielded from cancellation:
  SIGCONT once, ``shutdown`` (the caller's request), closing stdin + SIGTERM to the group,
  SIGKILL to the group, each wait returning as soon as the child is gone.
  :meth:`SidecarProcess.aclose` then reaps it and closes every stream (it kills a child
  still running only when the ladder was skipped: a session cancelled or failed).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Union

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process
from anyio.lowlevel import cancel_shielded_checkpoint

from indextts_sidecar.protocol.streams import FdReceiveStream, FdSendStream

from .._defaults import DEFAULT_SHUTDOWN_TIMEOUT
from .._exceptions import StartError
from .._wire._handshake import LossInfo

__all__ = ["Redactor", "SidecarProcess", "StderrLog", "stop_sidecar"]

log = logging.getLogger("indextts_client")
sidecar_log = logging.getLogger("indextts_client.sidecar")

#: Environment variable names whose values are secrets.
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
#: Hugging Face access tokens.
_HF_TOKEN = r"hf_[A-Za-z0-9]{30,}"
#: Shorter values are not redacted: they would blank out common words.
_MIN_SECRET = 4
REDACTED = "***"

_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}
#: The sidecar's log format: ``2026-01-01 12:00:00,123 LEVEL name[pid]: message``.
_LEVEL_RE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
#: Lines that continue a logged traceback.
_CONTINUATION_RE = re.compile(r"^(\s|Traceback \(most recent call last\)|[\w.]+(Error|Exception|Warning|Exit)\b)")


class Redactor:
    """Replaces secrets in text: Hugging Face tokens and the values of secret-named variables."""

    def __init__(self, env: Mapping[str, str], extra: Iterable[str] = ()) -> None:
        secrets = {value for name, value in env.items() if _SECRET_NAME.search(name) and len(value) >= _MIN_SECRET}
        secrets.update(value for value in extra if value)
        alternatives = [_HF_TOKEN, *(re.escape(value) for value in sorted(secrets, key=len, reverse=True))]
        self._pattern = re.compile("|".join(alternatives))

    def __call__(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text)


class StderrLog:
    """Drains a stderr stream line by line into logging and a bounded, redacted tail."""

    def __init__(
        self,
        redact: Redactor,
        *,
        pid: Union[int, None] = None,
        max_line: int = 4096,
        tail_lines: int = 64,
        tail_chars: int = 16 * 1024,
    ) -> None:
        self._redact = redact
        self._pid = pid
        self._max_line = max_line
        self._tail: deque[str] = deque()
        self._tail_lines = tail_lines
        self._tail_chars = tail_chars
        self._tail_size = 0
        self._partial = bytearray()
        self._level = logging.INFO
        #: Lines and bytes seen so far.
        self.lines = 0
        self.bytes = 0
        #: Set once the stream has ended (or failed) and the last partial line is out.
        self.eof = anyio.Event()

    async def pump(self, stream: ByteReceiveStream) -> None:
        """Read until the stream ends; never raises (except cancellation)."""
        try:
            while True:
                try:
                    data = await stream.receive(65536)
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    break
                self.feed(data)
        except Exception:
            log.exception("internal error draining the sidecar's stderr")
        finally:
            self.flush()
            self.eof.set()

    def feed(self, data: bytes) -> None:
        self.bytes += len(data)
        buffer = self._partial
        buffer += data
        start = 0
        while True:
            newline = buffer.find(b"\n", start)
            if newline < 0:
                break
            self._line(bytes(buffer[start:newline]))
            start = newline + 1
        del buffer[:start]
        limit = self._max_line
        while len(buffer) > limit:
            # Prefer to cut at a space, so a secret in ordinary text is never split in two.
            cut = buffer.rfind(b" ", limit * 3 // 4, limit)
            cut = limit if cut < 0 else cut + 1
            self._line(bytes(buffer[:cut]))
            del buffer[:cut]

    def flush(self) -> None:
        if self._partial:
            self._line(bytes(self._partial))
            self._partial.clear()

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        self.lines += 1
        self._tail.append(text)
        self._tail_size += len(text) + 1
        while len(self._tail) > self._tail_lines or (self._tail_size > self._tail_chars and len(self._tail) > 1):
            self._tail_size -= len(self._tail.popleft()) + 1
        match = _LEVEL_RE.match(text)
        if match is not None:
            self._level = _LEVELS[match.group(1)]
        elif not _CONTINUATION_RE.match(text):
            self._level = logging.INFO
        if sidecar_log.isEnabledFor(self._level):
            sidecar_log.log(self._level, "%s", self._redact(text), extra={"sidecar_pid": self._pid})

    def tail(self) -> str:
        """The last lines (at most ``tail_lines`` lines and about ``tail_chars`` characters), redacted."""
        text = "\n".join(self._tail)
        if len(text) > self._tail_chars:
            text = text[-self._tail_chars :]
        return self._redact(text)


def _exit_facts(returncode: Union[int, None]) -> tuple[Union[int, None], Union[int, None]]:
    if returncode is None:
        return None, None
    if returncode < 0:
        return None, -returncode
    return returncode, None


class SidecarProcess:
    """A spawned sidecar: its pipes, its stderr log and the means to stop it."""

    def __init__(
        self,
        process: Process,
        argv: Sequence[str],
        stderr: StderrLog,
        exit_grace: float,
        stdin: FdSendStream,
        stdout: FdReceiveStream,
    ) -> None:
        self.process = process
        self._stdin = stdin
        self._stdout = stdout
        self.argv = list(argv)
        self.stderr = stderr
        self._exit_grace = exit_grace
        self._closed = False

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Union[str, os.PathLike[str], None],
        redact: Redactor,
        exit_grace: float = DEFAULT_SHUTDOWN_TIMEOUT,
    ) -> SidecarProcess:
        """Spawn ``argv`` with a pipe each way for frames, and stderr drained into a log."""
        # The frame pipes are our own, read and written without blocking straight from
        # their descriptors: large reads into the frame buffer, on asyncio and trio alike
        # (asyncio's subprocess streams would hand out 64 KiB pieces to copy together).
        child_stdin, parent_stdin = os.pipe()
        parent_stdout, child_stdout = os.pipe()
        try:
            process = await anyio.open_process(
                list(argv),
                stdin=child_stdin,
                stdout=child_stdout,
                stderr=subprocess.PIPE,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(parent_stdin)
            os.close(parent_stdout)
            raise StartError(f"could not spawn the sidecar ({redact(shlex.join(argv))}): {exc}") from exc
        finally:
            os.close(child_stdin)
            os.close(child_stdout)
        log.debug("spawned sidecar pid %d: %s", process.pid, redact(shlex.join(argv)))
        return cls(
            process,
            argv,
            StderrLog(redact, pid=process.pid),
            exit_grace,
            FdSendStream(parent_stdin),
            FdReceiveStream(parent_stdout),
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    @property
    def stdin(self) -> ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> ByteReceiveStream:
        return self._stdout

    async def pump_stderr(self) -> None:
        assert self.process.stderr is not None
        await self.stderr.pump(self.process.stderr)

    def exit_info(self) -> LossInfo:
        exit_code, signum = _exit_facts(self.process.returncode)
        return LossInfo(exit_code=exit_code, signal=signum, stderr_tail=self.stderr.tail())

    async def describe_loss(self, kind: str) -> LossInfo:
        """Exit code, signal and stderr tail for a connection that ended (``kind`` as in Connection)."""
        if kind in ("eof", "aborted", "startup_error"):
            # The output ended, or the sidecar reported that it cannot start: it is
            # exiting; give it a moment to be reaped.
            await self.wait(self._exit_grace)
        if not self.running:
            # Its last words may still be in the stderr pipe.
            with anyio.move_on_after(0.5):
                await self.stderr.eof.wait()
        return self.exit_info()

    async def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the child to exit; return whether it has."""
        if self.running:
            with anyio.move_on_after(seconds):
                await self.process.wait()
        return not self.running

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the child's process group (it leads its own session)."""
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            if self.running:
                try:
                    self.process.send_signal(signal.Signals(signum))
                except ProcessLookupError:
                    pass

    async def aclose(self, grace: float) -> None:
        """Make sure the child is gone and reaped, then close every stream.  Shielded, bounded.

        After :func:`stop_sidecar` the child is gone already; a child still running here
        belongs to a session that was cancelled or failed, and is killed at once.
        """
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if self.running:
                self.signal_group(signal.SIGKILL)
                await self.wait(grace)
            if self.running:  # pragma: no cover - a process that survives SIGKILL (D state)
                log.error("sidecar pid %d survived SIGKILL; leaving it behind", self.pid)
                for stream in (self._stdin, self._stdout, self.process.stderr):
                    if stream is not None:
                        await stream.aclose()
                return
            with anyio.move_on_after(0.5):
                await self.stderr.eof.wait()
            await self._stdin.aclose()
            await self._stdout.aclose()
            with anyio.move_on_after(grace):
                await self.process.aclose()
            # asyncio closes pipe transports in call_soon callbacks: let them run, so no
            # descriptor outlives this call.
            await cancel_shielded_checkpoint()
            await cancel_shielded_checkpoint()


async def stop_sidecar(
    child: SidecarProcess,
    grace: float,
    *,
    shutdown: Union[Callable[[], Awaitable[object]], None] = None,
) -> None:
    """The stop ladder; each rung waits at most ``grace`` s and the ladder ends once the child is gone.

    1. SIGCONT to the group, once: a stopped child (SIGSTOP, a debugger) would act on
       neither ``shutdown`` nor SIGTERM.
    2. ``shutdown()``, when given (the protocol's request, which the sidecar acknowledges
       before it exits), and wait.
    3. Close stdin (the sidecar exits at end of input) and SIGTERM the group, and wait.
    4. SIGKILL the group, and wait.
    5. Once the child is gone, SIGKILL the group again: helpers it left behind die with it.

    Shielded from cancellation, so a cancelled caller never leaves a child behind.
    Closing the pipes and the process handle is :meth:`SidecarProcess.aclose`'s.
    """
    with anyio.CancelScope(shield=True):
        if child.running:
            child.signal_group(signal.SIGCONT)
        if shutdown is not None and child.running:
            with anyio.move_on_after(grace):
                await shutdown()
                await child.process.wait()
        if child.running:
            try:
                await child.stdin.aclose()
            except Exception:  # closing a broken pipe
                pass
            child.signal_group(signal.SIGTERM)
            await child.wait(grace)
        if child.running:
            log.warning("sidecar pid %d ignored SIGTERM for %g s; killing it", child.pid, grace)
            child.signal_group(signal.SIGKILL)
            await child.wait(grace)
        if not child.running:
            child.signal_group(signal.SIGKILL)
