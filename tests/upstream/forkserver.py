"""A fork server for the conformance suite: upstream's imports paid once a venv, not once a process.

Every sidecar and probe the suite starts in an upstream venv imports torch, transformers and
upstream's modules first: about 10 s of one core (``python -X importtime -c 'import
indextts.infer_v2'``), some 60 times a run.  ``serve`` imports them once, by the sidecar's own
rules (``openmp_waits`` before torch, upstream under ``preserved_process_state``), and forks a
child for each start.  ``write_launcher`` writes an executable that stands where the venv's
interpreter would: the suite hands it to the client as ``python=`` and runs its probes with it.
It hands the server its arguments, environment, working directory and standard streams.  The
child takes them over in a session of its own (as ``start_new_session`` gives a cold start),
runs the module or script as ``python -m``/``python script`` would, and exits as a cold process
does.  The launcher forwards every signal it can catch to the child's process group and exits as
the child did; if the launcher is killed, the server kills the child.

A start that could not be made the same as a cold one runs cold, the launcher ``exec``-ing the
real interpreter: an interpreter option (``-c``, ``-X``...), a module other than
``indextts_sidecar``, or an environment that differs from the server's in anything but the
variables read after start-up (``INDEXTTS_*``, ``PYTEST_*``, the shell's ``_``...).  ``INDEXTTS_UPSTREAM_FORKSERVER=0``
runs every start cold.  Each start is logged on the server's stderr, forked or cold and why.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Union

#: What the launcher may ask to be forked: ``-m indextts_sidecar ...`` or ``path/to/script.py ...``.
FORKED_MODULE = "indextts_sidecar"
#: Variables read after start-up, free to differ from the server's (the sidecar's own, pytest's),
#: and the shell's own.
RUNTIME_PREFIXES = ("INDEXTTS_", "PYTEST_")
SHELL_VARIABLES = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})
#: The signals a launcher forwards to its child's group (SIGKILL and SIGSTOP cannot be caught:
#: a killed launcher's child is killed by the server; a stopped one runs on).
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
)
_HEADER = struct.Struct("!I")


def _log(message: str) -> None:
    sys.stderr.write(f"forkserver[{os.getpid()}]: {message}\n")
    sys.stderr.flush()


def _reason_to_run_cold(request: dict[str, Any], environment: dict[str, str]) -> Union[str, None]:
    """Why this start cannot be forked from this server, or None when it can."""

    def imported(env: dict[str, str]) -> dict[str, str]:
        return {
            key: value
            for key, value in env.items()
            if not key.startswith(RUNTIME_PREFIXES) and key not in SHELL_VARIABLES
        }

    wanted, have = imported(request["env"]), imported(environment)
    differ = sorted(key for key in wanted.keys() | have.keys() if wanted.get(key) != have.get(key))
    return f"the environment differs in {', '.join(differ)}" if differ else None


class _Start:
    """What a forked child runs, once it has left the server's loop."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, added: dict[str, str]) -> None:
        self.argv, self.env, self.cwd, self.added = argv, env, cwd, added

    def run(self) -> None:
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.env)
        # What the sidecar's openmp_waits would have set before torch: the server set it before
        # its own import of torch, which this process shares.
        if not any(name in self.env for name in self.added):
            os.environ.update(self.added)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()  # a cold process seeds it afresh; every fork would share the server's
        import runpy

        if self.argv[0] == "-m":
            sys.argv = ["-m", *self.argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(self.argv[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(self.argv[0])
            sys.argv = list(self.argv)
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")


def _preload(modules: Sequence[str]) -> dict[str, str]:
    """Import ``modules`` as the sidecar would; returns what ``openmp_waits`` added to the environment."""
    import importlib

    from indextts_sidecar.engines.indextts import _upstream

    before = dict(os.environ)
    _upstream.openmp_waits()
    added = {key: value for key, value in os.environ.items() if before.get(key) != value}
    importlib.import_module("torch")
    with _upstream.preserved_process_state():
        for name in modules:
            importlib.import_module(name)
    return added


def serve(path: str, modules: Sequence[str]) -> Union[_Start, None]:
    """Serve starts on the Unix socket ``path`` until SIGTERM or the parent's end.

    Returns None in the server when it ends, and the start to run in each forked child.
    """
    environment = dict(os.environ)
    added = _preload(modules)
    # What is imported now lives as long as the server: left out of the collector, its pages are
    # not written (and so copied) by each child's collections, its exit's included.
    gc.freeze()
    server_pid, parent = os.getpid(), os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    stopping: list[int] = []
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.set_wakeup_fd(wake_write)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_read, selectors.EVENT_READ, "wake")
    children: dict[int, socket.socket] = {}  # pid -> its launcher's connection
    print("ready", flush=True)
    try:
        while not stopping and os.getppid() == parent:
            for key, _ in selector.select(timeout=1.0):
                if key.data == "wake":
                    os.read(wake_read, 4096)
                elif key.data == "accept":
                    connection, _ = listener.accept()
                    start = _accept(connection, environment, added, children, selector)
                    if start is not None:  # the child: leave the loop with nothing of the server's
                        selector.close()
                        listener.close()
                        os.close(wake_read)
                        os.close(wake_write)
                        for other in children.values():
                            other.close()
                        return start
                else:  # a launcher's connection: read only at its end (the launcher was killed)
                    pid = key.data
                    if not key.fileobj.recv(1):  # type: ignore[union-attr]
                        selector.unregister(key.fileobj)
                        _log(f"the launcher of {pid} is gone: killing it")
                        _kill_group(pid, signal.SIGKILL)
            _reap(children, selector)
    finally:
        if os.getpid() == server_pid:
            signal.set_wakeup_fd(-1)
            for pid in children:
                _kill_group(pid, signal.SIGKILL)
            listener.close()
            Path(path).unlink(missing_ok=True)
    return None


def _accept(
    connection: socket.socket,
    environment: dict[str, str],
    added: dict[str, str],
    children: dict[int, socket.socket],
    selector: selectors.BaseSelector,
) -> Union[_Start, None]:
    connection.settimeout(30)
    try:
        data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
            more = connection.recv(1 << 20)
            if not more:
                raise ConnectionError("the launcher hung up mid-request")
            data += more
        request = json.loads(data[_HEADER.size :])
    except (OSError, ValueError, struct.error) as exc:
        _log(f"a bad request: {exc}")
        connection.close()
        return None
    try:
        reason = _reason_to_run_cold(request, environment) if len(fds) == 3 else "no standard streams came"
        if reason is not None:
            _log(f"cold: {' '.join(request['argv'])[:200]}: {reason}")
            connection.sendall(json.dumps({"cold": reason}).encode() + b"\n")
            connection.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_child(fds)
            fds = []  # the child's 0, 1 and 2 now
            connection.close()
            return _Start(request["argv"], request["env"], request["cwd"], added)
    finally:
        for fd in fds:
            os.close(fd)
    _log(f"forked {pid}: {' '.join(request['argv'])[:200]}")
    connection.settimeout(None)
    connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    children[pid] = connection
    selector.register(connection, selectors.EVENT_READ, pid)
    return None


def _become_child(fds: list[int]) -> None:
    """In the forked child: a session of its own, the launcher's streams as 0, 1, 2, default signals."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)


def _reap(children: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    """Tell each ended child's launcher how it ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is None:
            continue
        _log(f"{pid} ended: {os.waitstatus_to_exitcode(status)}")
        try:
            selector.unregister(connection)
        except (KeyError, ValueError):
            pass
        try:
            connection.sendall(json.dumps({"status": status}).encode() + b"\n")
        except OSError:
            pass
        connection.close()


def _kill_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def launch(path: str, python: str, args: list[str]) -> None:
    """The launcher: have the server at ``path`` fork this start, or exec ``python`` cold."""

    def cold() -> None:
        os.execv(python, [python, *args])

    if not args or not (args[:2] == ["-m", FORKED_MODULE] or (args[0].endswith(".py") and args[0][0] != "-")):
        cold()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(path)
    except OSError:
        cold()
    payload = json.dumps({"argv": args, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    message = _HEADER.pack(len(payload)) + payload
    sent = socket.send_fds(client, [message], [0, 1, 2])
    if sent < len(message):
        client.sendall(message[sent:])
    replies = client.makefile("rb")
    reply = json.loads(replies.readline() or b'{"cold": "the server hung up"}')
    if "cold" in reply:
        client.close()
        cold()
    pid = reply["pid"]
    for signum in FORWARDED:
        signal.signal(signum, lambda number, _frame: _kill_group(pid, number))
    # The child holds the streams now: the client sees their end when the child's ends.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    line = replies.readline()
    if not line:  # the server is gone, and with it the child's status
        os._exit(70)
    status = json.loads(line)["status"]
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status))


def write_launcher(directory: Path, socket_path: str, python: str) -> Path:
    """An executable in ``directory`` that runs as ``python`` would, through the server at ``socket_path``."""
    import shlex

    launcher = directory / "python"
    command = [python, "-I", "-S", str(Path(__file__).resolve()), "launch", socket_path, python]
    launcher.write_text(f'#!/bin/sh\nexec {shlex.join(command)} "$@"\n')
    launcher.chmod(0o755)
    return launcher


def main(argv: list[str]) -> int:
    if argv[:1] == ["launch"]:
        launch(argv[1], argv[2], argv[3:])
        return 0  # not reached: launch execs or exits
    if argv[:1] == ["serve"]:
        start = serve(argv[1], argv[2:])
        if start is None:
            return 0
        start.run()
        return 0
    sys.stderr.write("usage: forkserver.py serve SOCKET MODULE... | launch SOCKET PYTHON ARGS...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
