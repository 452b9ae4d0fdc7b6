"""setup against a Hugging Face hub on loopback: the real huggingface_hub code, reached through HF_ENDPOINT.

The hub (hub_support.py) serves stand-in checkpoints (bytes, no torch): what is checked here is
which requests setup makes, where each file lands, and what each failure says.  The full path
with real tiny checkpoints and a synthesis is tests/upstream/test_setup.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CLI_LIMIT, run_cli
from hub_support import Hub, Stall, standin_repos

from indextts_client._registry import read_record
from indextts_sidecar.engines.indextts import AUX_FILES, AUX_FILES_25, CHECKPOINT_FILES

ADOPT = ["--python", sys.executable, "--no-verify"]


@pytest.fixture
def hub() -> Iterator[Hub]:
    with Hub(standin_repos()).running() as running:
        yield running


def _env(hub: Hub, **extra: str) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1", **extra}


def _model_dir(home: Path, repo: str = "IndexTeam/IndexTTS-2") -> Path:
    return home / "models" / repo.replace("/", "--")


def _last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip().splitlines()[-1]


def _not_ready() -> bool:
    record = read_record("indextts2")
    return record is None or not record.ready


def test_the_model_and_the_auxiliary_models_land_where_the_adapter_reads_them(hub: Hub, home: Path) -> None:
    result = run_cli(["setup", "indextts2", *ADOPT], _env(hub))
    assert result.returncode == 0, result.stderr
    model_dir = _model_dir(home)
    repos = standin_repos()
    for name in (*CHECKPOINT_FILES, "qwen0.6bemo4-merge/config.json"):
        assert (model_dir / name).read_bytes() == repos["IndexTeam/IndexTTS-2"].files[name], name
    assert [name for name in AUX_FILES if not (model_dir / name).is_file()] == []
    assert (model_dir / "hf_cache/semantic_codec_model.safetensors").read_bytes() == b"stand-in codec"
    assert (model_dir / "hf_cache/bigvgan/bigvgan_generator.pt").read_bytes() == b"stand-in bigvgan"
    assert list(model_dir.rglob("*.part*")) == []
    # Only what upstream reads: not w2v-bert's 2 GB conformer, not MaskGCT's other codecs.
    for unwanted in ("conformer_shaw.pt", "acoustic_codec/model.safetensors", "bigvgan_discriminator_optimizer.pt"):
        assert [r for r in hub.requested(unwanted) if r[0] == "GET"] == [], unwanted
    record = read_record("indextts2")
    assert record is not None and record.ready and record.model == "IndexTeam/IndexTTS-2"
    assert record.model_dir == str(model_dir)

    # Again: everything is on disk, so nothing is fetched a second time.
    fetched = len([r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]])
    again = run_cli(["setup", "indextts2", *ADOPT], _env(hub))
    assert again.returncode == 0, again.stderr
    assert len([r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]) == fetched


def test_indextts25_skips_the_maskgct_codec(hub: Hub, home: Path) -> None:
    result = run_cli(["setup", "indextts2.5", *ADOPT], _env(hub))
    assert result.returncode == 0, result.stderr
    model_dir = _model_dir(home, "IndexTeam/IndexTTS-2.5")
    assert [name for name in AUX_FILES_25 if not (model_dir / name).is_file()] == []
    assert hub.requested("semantic_codec/model.safetensors") == []


def test_an_unknown_model_id_names_the_option(hub: Hub) -> None:
    result = run_cli(["setup", "indextts2", "--model", "IndexTeam/IndexTTS-9", *ADOPT], _env(hub))
    assert result.returncode == 1
    assert _last_line(result) == (
        f"indextts-client setup: no model IndexTeam/IndexTTS-9 on {hub.url}: check --model "
        "(e.g. IndexTeam/IndexTTS-2); if it is private or gated, set HF_TOKEN"
    )
    assert _not_ready()


def test_a_model_of_the_other_version_is_refused(hub: Hub) -> None:
    result = run_cli(["setup", "indextts2", "--model", "IndexTeam/IndexTTS-2.5", *ADOPT], _env(hub))
    assert result.returncode == 1
    assert "holds IndexTTS-2.5 checkpoints, not IndexTTS-2: run `indextts-client setup indextts2.5" in result.stderr
    assert _not_ready()


def test_a_gated_model_without_a_token_says_to_set_one() -> None:
    repos = standin_repos()
    repos["IndexTeam/IndexTTS-2"].gated = True
    with Hub(repos).running() as hub:
        result = run_cli(["setup", "indextts2", *ADOPT], _env(hub))
        assert result.returncode == 1
        assert _last_line(result) == (
            f"indextts-client setup: IndexTeam/IndexTTS-2 is gated on {hub.url}: accept its terms on its page "
            "there, then set HF_TOKEN (or run `hf auth login`) and run setup again"
        )
        assert _not_ready()
        # With the token, HF_TOKEN as huggingface_hub reads it, the same command succeeds.
        allowed = run_cli(["setup", "indextts2", *ADOPT], _env(hub, HF_TOKEN=hub.token))
        assert allowed.returncode == 0, allowed.stderr
        assert not _not_ready()


def test_a_hub_in_trouble_is_one_line(hub: Hub) -> None:
    hub.fail_with = 500
    result = run_cli(["setup", "indextts2", *ADOPT], _env(hub))
    assert result.returncode == 1
    line = _last_line(result)
    assert line.startswith(f"indextts-client setup: the hub at {hub.url} failed on IndexTeam/IndexTTS-2 (")
    assert line.endswith("pass --model-dir a directory that holds the checkpoints")
    assert "Traceback" not in result.stderr and _not_ready()


def test_no_network_names_hf_endpoint_and_model_dir() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    result = run_cli(["setup", "indextts2", *ADOPT], {"HF_ENDPOINT": endpoint, "HF_HUB_ETAG_TIMEOUT": "5"})
    assert result.returncode == 1
    line = _last_line(result)
    assert line.startswith(f"indextts-client setup: cannot reach the hub at {endpoint} for IndexTeam/IndexTTS-2")
    assert "set HF_ENDPOINT to a mirror you can reach" in line and "--model-dir" in line
    assert _not_ready()


def test_hf_hub_offline_with_nothing_on_disk_says_what_to_do(hub: Hub) -> None:
    result = run_cli(["setup", "indextts2", *ADOPT], _env(hub, HF_HUB_OFFLINE="1"))
    assert result.returncode == 1
    assert "HF_HUB_OFFLINE is set" in _last_line(result) or "--model-dir" in _last_line(result)
    assert [r for r in hub.requests if "/resolve/" in r[1]] == []
    assert _not_ready()


def test_a_full_disk_is_refused_before_downloading(
    hub: Hub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The free space is simulated: setup asks shutil.disk_usage before each download, and the
    # test answers 1 MB free (gpt.pth alone is 4 MB).  A write that fails with ENOSPC mid-way
    # takes the same message through the errno check in hub_errors.
    import shutil

    from indextts_client._cli import main
    from indextts_client._setup import _hub

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    real = shutil.disk_usage
    monkeypatch.setattr(_hub.shutil, "disk_usage", lambda path: real(path)._replace(free=1 << 20))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(
        huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    assert main(["setup", "indextts2", "-q", *ADOPT]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "has 0.0 GB free and the models need 0.0 GB" in line
    assert "free space there, or put the models elsewhere with --model-dir DIR or INDEXTTS_HOME" in line
    assert [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]] == []
    assert _not_ready()


#: huggingface_hub writes what it receives in chunks of this size (constants.DOWNLOAD_CHUNK_SIZE).
CHUNK = 10 << 20


def _partial(model_dir: Path, size: int) -> Path:
    """Wait until huggingface_hub's partial file holds ``size`` bytes (a condition, bounded), and return it."""
    deadline = time.monotonic() + CLI_LIMIT
    while True:
        found = [p for p in model_dir.glob("*.part") if p.stat().st_size >= size]
        if found:
            return found[0]
        assert time.monotonic() < deadline, "the first chunk never reached the disk"
        time.sleep(0.05)


def test_a_connection_cut_half_way_resumes_in_the_same_run(home: Path) -> None:
    repos = standin_repos(gpt_size=24 << 20)
    with Hub(repos).running() as hub:
        hub.stall = Stall("IndexTeam/IndexTTS-2", "gpt.pth", after=12 << 20)
        child = subprocess.Popen(
            [sys.executable, "-m", "indextts_client", "setup", "indextts2", *ADOPT],
            env={**os.environ, **_env(hub)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert hub.stall.reached.wait(CLI_LIMIT)
            _partial(_model_dir(home), CHUNK)
            hub.stall.release.set()  # the server drops the connection after 12 MB
            _, err = child.communicate(timeout=CLI_LIMIT)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        assert child.returncode == 0, err
        ranges = [r[2] for r in hub.requested("/gpt.pth") if r[0] == "GET"]
        assert ranges[0] is None and ranges[-1] is not None and ranges[-1].startswith("bytes=")
        assert int(ranges[-1][len("bytes=") : -1]) >= CHUNK
        assert (_model_dir(home) / "gpt.pth").read_bytes() == repos["IndexTeam/IndexTTS-2"].files["gpt.pth"]


def test_ctrl_c_mid_download_then_the_next_run_resumes(home: Path) -> None:
    repos = standin_repos(gpt_size=24 << 20)  # over one chunk, so that one is on disk at the cut
    with Hub(repos).running() as hub:
        hub.stall = Stall("IndexTeam/IndexTTS-2", "gpt.pth", after=12 << 20)
        child = subprocess.Popen(
            [sys.executable, "-m", "indextts_client", "setup", "indextts2", *ADOPT],
            env={**os.environ, **_env(hub)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert hub.stall.reached.wait(CLI_LIMIT)
            partial = _partial(_model_dir(home), CHUNK)
            child.send_signal(signal.SIGINT)
            _, err = child.communicate(timeout=CLI_LIMIT)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        assert child.returncode == 130, err
        assert err.strip().splitlines()[-1].startswith("indextts-client setup: interrupted; run the same command again")
        assert _not_ready()
        kept = partial.stat().st_size
        assert kept >= CHUNK

        hub.stall.release.set()
        hub.stall = None
        again = run_cli(["setup", "indextts2", *ADOPT], _env(hub))
        assert again.returncode == 0, again.stderr
        ranges = [r[2] for r in hub.requested("/gpt.pth") if r[0] == "GET"]
        assert ranges[-1] == f"bytes={kept}-"
        assert (_model_dir(home) / "gpt.pth").read_bytes() == repos["IndexTeam/IndexTTS-2"].files["gpt.pth"]
        assert not _not_ready()


def test_a_disk_that_fills_mid_download_is_the_same_one_line(tmp_path: Path) -> None:
    # A write that fails with ENOSPC (what the preflight cannot foresee: another writer on the
    # disk) reaches setup as an OSError; hub_errors turns it into the same fix.
    import errno

    from indextts_client._setup._build import SetupError
    from indextts_client._setup._hub import hub_errors

    with pytest.raises(SetupError) as caught, hub_errors("IndexTeam/IndexTTS-2", tmp_path):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(caught.value) == (
        f"the disk under {tmp_path} is full: free space there (the partial download resumes on the next run), "
        "or put the models elsewhere with --model-dir DIR or INDEXTTS_HOME"
    )
