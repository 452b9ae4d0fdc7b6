"""Several sidecars per GPU: ``Pool(per_device=N)``, and ``mps=True``'s private MPS daemon.

This machine has no NVIDIA driver, so the MPS tests check what can be checked without
one: the refusal (no control binary, no ``nvidia-smi``, no libcuda), and the daemon's
start/query/stop protocol, environment and clean-up against a stand-in
``nvidia-cuda-mps-control`` script put on ``PATH`` (it keeps its state in files; it
forks no daemon and touches no GPU).  The sidecars are real processes (fake engine).
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import pytest
from client_support import FAKE_OPTIONS, expected

from indextts_client import MpsUnavailableError, Pool
from indextts_client._pool import _mps as mps_module
from indextts_client._pool._cli import add_pool_arguments, pool_kwargs

pytestmark = pytest.mark.anyio

TIMEOUT = 60

#: A stand-in control binary: it keeps the daemon's state in its pipe directory, and writes
#: every call (arguments, command, the two directories) to $FAKE_MPS_RECORD.
FAKE_CONTROL = """\
import os, sys
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
logs = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "")
line = "" if sys.argv[1:] == ["-d"] else sys.stdin.readline().strip()
control = os.path.join(pipe, "control")
with open(os.environ["FAKE_MPS_RECORD"], "a") as record:
    alive = ""
    if line == "quit":
        watch = os.environ["FAKE_MPS_RECORD"] + ".watch"
        pids = open(watch).read().split() if os.path.exists(watch) else []
        alive = " alive=" + ",".join(p for p in pids if os.path.exists(f"/proc/{p}"))
    record.write(f"{' '.join(sys.argv[1:]) or line}|{pipe}|{logs}{alive}\\n")
if sys.argv[1:] == ["-d"]:
    if os.environ.get("FAKE_MPS_FAIL"):
        sys.stderr.write("stand-in: no GPU here\\n")
        sys.exit(3)
    open(control, "w").close()
    sys.exit(0)
if not os.path.exists(control):
    print("Cannot find MPS control daemon process")
    sys.exit(1)
clients = os.path.join(pipe, "clients")
if line == "get_server_list":
    if os.path.exists(clients):
        print(4242)
elif line == "get_client_list 4242":
    print(open(clients).read().strip())
elif line == "quit":
    os.unlink(control)
else:
    print("unknown command")
    sys.exit(1)
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def fake_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with a stand-in control binary and nvidia-smi, and a libcuda the linker 'finds'."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "nvidia-cuda-mps-control", f"#!{sys.executable}\n{FAKE_CONTROL}")
    _executable(bin_dir / "nvidia-smi", "#!/bin/sh\nexit 0\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(tmp_path / "calls"))
    monkeypatch.setattr(mps_module, "_find_libcuda", lambda: "libcuda.so.1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the daemon's directory goes
    return tmp_path


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


def _calls(directory: Path) -> list[str]:
    return (directory / "calls").read_text().splitlines()


async def test_per_device_places_n_sidecars_on_each_device_round_robin() -> None:
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", devices=["cuda:0", "1"], per_device=2, engine_options=FAKE_OPTIONS) as pool:
            health = await pool.health()
            assert [m.device for m in health] == ["cuda:0", "1", "cuda:0", "1"]
            assert [m.mps for m in health] == [None] * 4
            pins = [_environ(m.pid)["CUDA_VISIBLE_DEVICES"] for m in health if m.pid is not None]
            assert pins == ["0", "1", "0", "1"]
            assert (await pool.synthesize("four members")).samples.tobytes() == expected("four members")


def test_per_device_is_checked() -> None:
    with pytest.raises(ValueError, match="per_device must be an int >= 1"):
        Pool("fake", devices=["0"], per_device=0)
    with pytest.raises(ValueError, match="give devices"):
        Pool("fake", size=2, per_device=2)
    with pytest.raises(ValueError, match=r"len\(devices\) \* per_device"):
        Pool("fake", devices=["0", "1"], per_device=2, size=2)
    with pytest.raises(ValueError, match="spawns none"):
        Pool(urls=["tcp://127.0.0.1:1"], mps=True)
    with pytest.raises(ValueError, match="no MPS daemon"):
        anyio.run(Pool("fake").mps_attached)


@pytest.mark.parametrize("missing", ["control", "nvidia-smi", "libcuda"])
async def test_mps_is_refused_with_a_typed_error_where_there_is_no_nvidia_driver(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_driver: Path
) -> None:
    if missing == "libcuda":
        monkeypatch.setattr(mps_module, "_find_libcuda", lambda: None)
    else:
        name = "nvidia-cuda-mps-control" if missing == "control" else "nvidia-smi"
        (fake_driver / "bin" / name).unlink()
        # Only the stand-in folder: a real driver on this machine must not be found either.
        monkeypatch.setenv("PATH", str(fake_driver / "bin"))
    pool = Pool("fake", devices=["0"], per_device=2, mps=True, engine_options=FAKE_OPTIONS)
    with anyio.fail_after(TIMEOUT), pytest.raises(MpsUnavailableError) as caught:
        await pool.start()
    assert caught.value.code == "mps_unavailable"
    fragment = {"control": "nvidia-cuda-mps-control is not on PATH", "nvidia-smi": "no NVIDIA driver"}
    assert fragment.get(missing, "libcuda") in str(caught.value)
    assert [client.pid for client in pool.members] == [None, None]  # no sidecar was started
    assert not list(tmp_path.glob("indextts-mps-*"))
    assert not (tmp_path / "calls").exists()  # the control binary never ran
    await pool.aclose()


async def test_a_daemon_that_fails_to_start_is_reported_with_its_output(
    fake_driver: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    pool = Pool("fake", devices=["0"], mps=True, engine_options=FAKE_OPTIONS)
    with anyio.fail_after(TIMEOUT), pytest.raises(MpsUnavailableError) as caught:
        await pool.start()
    assert "-d failed with exit code 3" in str(caught.value)
    assert "stand-in: no GPU here" in caught.value.stderr_tail
    assert pool.members[0].pid is None
    assert not list(fake_driver.glob("indextts-mps-*"))  # its directory is gone with it
    await pool.aclose()


async def test_mps_daemon_env_attachment_check_and_stop(fake_driver: Path, caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(TIMEOUT):
        # Loaded below, not at start: the attachment is checked after the test set who attached.
        pool = Pool("fake", devices=["0"], per_device=2, mps=True, engine_options=FAKE_OPTIONS, load_on_start=False)
        async with pool:
            (directory,) = fake_driver.glob("indextts-mps-*")
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700
            pipe, logs = directory / "pipe", directory / "log"
            pids = [client.pid for client in pool.members]
            assert None not in pids
            for pid in pids:
                assert pid is not None
                environ = _environ(pid)
                assert environ["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
                assert environ["CUDA_MPS_LOG_DIRECTORY"] == str(logs)
                assert environ["CUDA_VISIBLE_DEVICES"] == "0"
            (fake_driver / "calls.watch").write_text(" ".join(map(str, pids)))
            # Before any load nothing attached (the stand-in has no server yet).
            assert await pool.mps_attached() == [False, False]
            # The first sidecar attached; the second fell back to time-slicing.
            (pipe / "clients").write_text(f"{pids[0]}\n")
            with caplog.at_level(logging.WARNING, logger="indextts_client"):
                await pool.load()
            warnings = [r.getMessage() for r in caplog.records if "MPS daemon" in r.getMessage()]
            assert warnings == [
                f"pool member 1 (pid {pids[1]}) is not attached to the pool's MPS daemon: it time-slices 0"
            ]
            assert [m.mps for m in await pool.health()] == [True, False]
            assert (await pool.synthesize("under mps")).samples.tobytes() == expected("under mps")
        assert not directory.exists()
        calls = _calls(fake_driver)
        assert calls[0] == f"-d|{pipe}|{logs}"
        assert calls[1] == f"get_server_list|{pipe}|{logs}"
        assert calls[-1] == f"quit|{pipe}|{logs} alive="  # quit once both sidecars had exited
        assert calls.count(f"quit|{pipe}|{logs} alive=") == 1


def test_serve_and_wyoming_take_per_device_and_mps() -> None:
    for command in ("serve", "wyoming"):
        result = subprocess.run(
            [sys.executable, "-m", "indextts_client", command, "--help"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert "--per-device N" in result.stdout and "--mps" in result.stdout, command


def test_the_pool_options_say_per_device_and_mps() -> None:
    parser = argparse.ArgumentParser()
    add_pool_arguments(parser)
    args = parser.parse_args(["--devices", "cuda:0,cuda:1", "--per-device", "3", "--mps"])
    kwargs = pool_kwargs(args, parser)
    assert (kwargs["devices"], kwargs["per_device"], kwargs["mps"]) == (["cuda:0", "cuda:1"], 3, True)
    plain = pool_kwargs(parser.parse_args(["--devices", "0"]), parser)
    assert "mps" not in plain and "per_device" not in plain  # what Pool takes by default
    for bad in (["--per-device", "2"], ["--devices", "0", "--per-device", "0"]):
        with pytest.raises(SystemExit):
            pool_kwargs(parser.parse_args(bad), parser)
