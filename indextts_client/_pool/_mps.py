"""A private NVIDIA MPS control daemon for a pool's sidecars (``Pool(..., mps=True)``).

Several sidecars on one GPU time-slice it unless they share it through NVIDIA's
Multi-Process Service.  :class:`MpsDaemon` runs a control daemon of the pool's own: its
pipe and log directories (``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``) live
in a private temporary directory, every sidecar is started with those variables
(:attr:`MpsDaemon.env`), and the daemon is stopped at close (``echo quit |
nvidia-cuda-mps-control``, shielded), so it neither uses nor disturbs a system-wide one.

Whether a sidecar attached is asked of the control daemon, in its documented commands
(``man nvidia-cuda-mps-control``): ``get_server_list`` (the MPS servers' PIDs) and
``get_client_list PID`` (the client PIDs of one server).  CUDA connects a process to the
daemon when it first initializes, so a sidecar is a client from the model's load on; one
that loaded and is no client fell back to time-slicing (the driver does so without an
error when it cannot reach the pipe).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Union

import anyio

from .._exceptions import StartError

__all__ = ["CONTROL", "MpsDaemon", "MpsUnavailableError", "mps_problem"]

log = logging.getLogger("indextts_client")

#: The control daemon's binary, from the NVIDIA driver's utilities.
CONTROL = "nvidia-cuda-mps-control"
#: Seconds each control command (start, a query, quit) may take.
COMMAND_TIMEOUT = 30.0
#: Queries tried while the daemon opens its control pipe after ``-d`` returned (about 10 s in all).
PIPE_ATTEMPTS = 30


class MpsUnavailableError(StartError):
    """``mps=True`` where MPS cannot run (no NVIDIA driver, no control binary), or its daemon failed."""


def _find_libcuda() -> Union[str, None]:
    """The NVIDIA driver's CUDA library, as the dynamic linker would find it; None without a driver."""
    import ctypes.util

    return ctypes.util.find_library("cuda")


def mps_problem() -> Union[str, None]:
    """Why a private MPS daemon cannot run here (no NVIDIA driver), or None.  Blocking (``ldconfig``)."""
    if shutil.which(CONTROL) is None:
        return f"{CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities)"
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not on PATH: no NVIDIA driver is installed"
    if _find_libcuda() is None:
        return "libcuda (the NVIDIA driver's CUDA library) is not found by the dynamic linker"
    return None


def _pids(text: str) -> list[int]:
    return [int(word) for word in re.findall(r"\b\d+\b", text)]


class MpsDaemon:
    """One private MPS control daemon: :meth:`start`, :meth:`clients`, :meth:`stop`.

    The directory is named when the object is made (so :attr:`env` is known before the
    sidecars are configured) and created, private (0700), by :meth:`start`.
    """

    def __init__(self, parent: Union[str, None] = None) -> None:
        base = parent if parent is not None else tempfile.gettempdir()
        self.directory = os.path.join(base, f"indextts-mps-{os.getpid()}-{secrets.token_hex(6)}")
        self.pipe_directory = os.path.join(self.directory, "pipe")
        self.log_directory = os.path.join(self.directory, "log")
        #: The variables every sidecar of the pool starts with.
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_directory, "CUDA_MPS_LOG_DIRECTORY": self.log_directory}
        self.running = False

    async def start(self) -> None:
        """Check for a driver, make the directories, start the daemon and wait for its pipe."""
        problem = await anyio.to_thread.run_sync(mps_problem)
        if problem is not None:
            raise MpsUnavailableError(f"mps=True needs NVIDIA MPS: {problem}", code="mps_unavailable")
        os.mkdir(self.directory, 0o700)  # exclusive: never a directory someone made before us
        try:
            os.mkdir(self.pipe_directory, 0o700)
            os.mkdir(self.log_directory, 0o700)
            self.running = True
            code = await self._daemonize()
            if code != 0:
                raise MpsUnavailableError(
                    f"{CONTROL} -d failed with exit code {code}",
                    code="mps_unavailable",
                    stderr_tail=self.log_tail(),
                )
            # ``-d`` returns once the daemon forked; it answers once its control pipe exists.
            for attempt in range(PIPE_ATTEMPTS):
                code, output = await self._control([], "get_server_list")
                if code == 0:
                    break
                await anyio.sleep(0.02 * (attempt + 1))
            else:
                raise MpsUnavailableError(
                    f"the private MPS control daemon does not answer on its pipe: {output.strip()}",
                    code="mps_unavailable",
                    stderr_tail=self.log_tail(),
                )
        except BaseException:
            await self.stop()
            raise
        log.info("private MPS control daemon started (pipe directory %s)", self.pipe_directory)

    async def command(self, line: str) -> str:
        """Send one control command (``get_server_list``...); its output.  Raises if it fails."""
        code, output = await self._control([], line)
        if code != 0:
            raise MpsUnavailableError(
                f"{CONTROL}: {line!r} failed with exit code {code}: {output.strip()}",
                code="mps_unavailable",
                stderr_tail=self.log_tail(),
            )
        return output

    async def clients(self) -> set[int]:
        """The PIDs of every process attached to one of the daemon's MPS servers."""
        attached: set[int] = set()
        for server in _pids(await self.command("get_server_list")):
            attached.update(_pids(await self.command(f"get_client_list {server}")))
        return attached

    async def attached(self, pids: Sequence[Union[int, None]]) -> list[Union[bool, None]]:
        """Per PID, whether it is an MPS client of this daemon (None for a missing PID)."""
        clients = await self.clients()
        return [None if pid is None else pid in clients for pid in pids]

    async def stop(self) -> None:
        """``quit`` the daemon (bounded, shielded) and remove its directory; safe to call twice."""
        with anyio.CancelScope(shield=True):
            if self.running:
                self.running = False
                try:
                    with anyio.move_on_after(COMMAND_TIMEOUT):
                        code, output = await self._control([], "quit")
                        if code != 0:
                            log.warning("%s: quit failed with exit code %d: %s", CONTROL, code, output.strip())
                except OSError as exc:
                    log.warning("%s: quit failed: %s", CONTROL, exc)
            await anyio.to_thread.run_sync(shutil.rmtree, self.directory, True)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the daemon's start output and control log, if any."""
        tail = []
        for name in ("start.log", "control.log"):
            try:
                with open(os.path.join(self.log_directory, name), encoding="utf-8", errors="replace") as file:
                    tail += file.readlines()[-lines:]
            except OSError:
                pass
        return "".join(tail)

    async def _daemonize(self) -> int:
        """``nvidia-cuda-mps-control -d``: its exit code once it forked the daemon.

        Its output goes to a file in the log directory, not a pipe: the daemon it leaves
        behind may keep the descriptors, and a pipe would then never reach its end.
        """
        path = os.path.join(self.log_directory, "start.log")
        with open(path, "ab") as output:  # noqa: ASYNC230 - a new local file in our own directory
            with anyio.fail_after(COMMAND_TIMEOUT):
                process = await anyio.open_process(
                    [CONTROL, "-d"],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=output,
                    env={**os.environ, **self.env},
                )
                async with process:
                    return await process.wait()

    async def _control(self, args: list[str], line: str) -> tuple[int, str]:
        """Send ``line`` to the control daemon through its binary; the exit code and output."""
        with anyio.fail_after(COMMAND_TIMEOUT):
            result = await anyio.run_process(
                [CONTROL, *args], input=(line + "\n").encode(), env={**os.environ, **self.env}, check=False
            )
        output = (result.stdout + result.stderr).decode("utf-8", errors="replace")
        return result.returncode, output
