"""The HTTP server as the tests run it: a real ``python -m indextts_client.http`` process on a
loopback socket bound here, its log read line by line (the "ready" line is the signal that
the sidecars are up), and PyAV as the independent decoder of what it answers."""

from __future__ import annotations

import io
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Union

TIMEOUT = 60
KEY = "test-key-1234"
AUTH = {"Authorization": f"Bearer {KEY}"}
RATE = 24000  # the fake engine's default rate, and OpenAI's pcm rate


class Server:
    def __init__(self, process: subprocess.Popen[bytes], base: str) -> None:
        self.process, self.base = process, base
        self.lines: queue.Queue[Union[str, None]] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            line = raw.decode("utf-8", "replace")
            self.log.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str, timeout: float = TIMEOUT) -> str:
        """The first log line (from now on) holding ``text``; fails on the server's exit or the timeout."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"no log line with {text!r} within {timeout} s; log: {''.join(self.log)}"
                ) from None
            if line is None:
                raise AssertionError(f"the server exited before logging {text!r}; log: {''.join(self.log)}")
            if text in line:
                return line

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.base.removeprefix("http://").split(":")
        return host, int(port)


@contextmanager
def server(
    *args: str,
    env: Union[dict[str, str], None] = None,
    preexec_fn: Union[Callable[[], Any], None] = None,
    ready: bool = True,
) -> Iterator[Server]:
    """The server with ``args``; with ``ready``, once it logged that its sidecars are up."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    port = listener.getsockname()[1]
    command = [sys.executable, "-m", "indextts_client.http", "--fd", str(listener.fileno()), *args]
    process = subprocess.Popen(
        command,
        pass_fds=[listener.fileno()],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=preexec_fn,
    )
    listener.close()
    running = Server(process, f"http://127.0.0.1:{port}")
    try:
        if ready:
            running.wait_for("serving: engine")
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - the server ignored SIGTERM
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def decode(data: bytes) -> tuple[str, int, int]:
    """(container format, sample rate, samples) as PyAV reads ``data``."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return container.format.name, stream.codec_context.sample_rate, samples


#: Per format, how many samples (at the decoded rate) a decoder may read beyond the source:
#: the encoder's priming (LAME's 576 + 529 decoder delay, AAC's 1024, none for Opus, whose
#: pre-skip the decoder drops) plus one codec frame of padding at the end.
SLACK = {"mp3": 1105 + 1152, "aac": 1024 + 1024, "opus": 960, "flac": 0, "wav": 0, "pcm": 0}


def assert_duration(fmt: str, data: bytes, samples: int, rate: int) -> None:
    """The body decodes as ``fmt`` and lasts ``samples`` at ``rate``, within one codec frame."""
    if fmt == "pcm":
        assert len(data) == samples * 2
        return
    _, decoded_rate, decoded = decode(data)
    expected = samples * decoded_rate / rate
    assert expected <= decoded + 1 and decoded - expected <= SLACK[fmt] + 1, (fmt, decoded, expected)


def speech(**body: Any) -> dict[str, Any]:
    return {"model": "indextts", "voice": "alloy", **body}


def environ(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def silence_runs(pcm: bytes) -> list[tuple[bool, int]]:
    """16-bit PCM as runs of ``(silent, samples)``: the fake engine's tones are never zero, so a
    run of zeros is a pause (an SSML break), and its length is exact."""
    runs: list[tuple[bool, int]] = []
    for silent in (sample == 0 for sample in memoryview(pcm).cast("h")):
        if runs and runs[-1][0] == silent:
            runs[-1] = (silent, runs[-1][1] + 1)
        else:
            runs.append((silent, 1))
    return runs
