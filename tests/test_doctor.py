"""The doctor: ``python -m indextts_sidecar --doctor`` and ``indextts_client._doctor``.

The doctor runs under this interpreter with PYTHONPATH pointing at a stand-in flavour
(tests/standin), the torch stub, and fake ``*.dist-info`` directories that make
importlib.metadata report the transformers version a test wants.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Union

import anyio
import harness
import msgspec
import pytest
from rich.console import Console

from indextts_client._doctor import (
    DoctorReport,
    Problem,
    doctor_command,
    exit_code,
    render,
    run_doctor,
    with_engine_options,
)
from indextts_sidecar.engines.indextts import CHECKPOINT_FILES

STANDIN = Path(__file__).resolve().parent / "standin"
ALL_ENTRIES = [*CHECKPOINT_FILES, "qwen0.6bemo4-merge/"]


def make_checkpoints(root: Path, *, skip: tuple[str, ...] = (), hf_cache: bool = True, version: str = "2") -> Path:
    """The doctor's checks include the auxiliary-model cache: present unless asked otherwise."""
    return harness.make_checkpoints(root, skip=skip, hf_cache=hf_cache, version=version)


def fake_distribution(root: Path, name: str, version: str) -> Path:
    """A directory on which importlib.metadata finds ``name`` at ``version``."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def doctor_env(
    tmp_path: Path,
    flavour: Union[str, None],
    *,
    torch: bool = True,
    transformers: Union[str, None] = "4.52.1",
    cuda: bool = True,
) -> dict[str, str]:
    paths = []
    if flavour:
        paths.append(str(STANDIN / flavour))
    if torch:
        paths.append(str(STANDIN / "torchstub"))
    if transformers:
        paths.append(str(fake_distribution(tmp_path / "site", "transformers", transformers)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("INDEXTTS_STANDIN_")}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if cuda:
        env["INDEXTTS_STANDIN_CUDA"] = "1"
    return env


def doctor(env: dict[str, str], model_dir: Union[Path, None] = None) -> dict[str, Any]:
    """Run the sidecar's doctor; check it printed exactly one JSON line and exited 0."""
    command = [sys.executable, "-m", "indextts_sidecar", "--doctor"]
    if model_dir is not None:
        command += ["--model-dir", str(model_dir)]
    out = subprocess.run(command, capture_output=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr.decode()
    lines = out.stdout.decode().splitlines()
    assert len(lines) == 1, f"stdout must hold the report alone: {out.stdout!r}"
    report: dict[str, Any] = json.loads(lines[0])
    report["_stderr"] = out.stderr.decode()
    return report


def whats(items: list[dict[str, str]]) -> str:
    return "\n".join(item["what"] for item in items)


# ----------------------------------------------------------------- the sidecar side


def test_no_indextts_and_no_torch(tmp_path: Path) -> None:
    report = doctor(doctor_env(tmp_path, None, torch=False, transformers=None, cuda=False))
    assert report["ok"] is False and report["doctor"] == 1
    assert report["python"]["executable"] == sys.executable
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert report["packages"]["indextts_sidecar"] and report["packages"]["numpy"]
    assert report["packages"]["torch"] is None and report["packages"]["indextts"] is None
    assert report["torch"]["importable"] is False and "torch" in report["torch"]["error"]
    assert report["indextts"]["found"] is False
    problems = whats(report["problems"])
    assert "torch does not import" in problems
    assert "indextts is not installed" in problems
    assert all(p["fix"] for p in report["problems"])
    assert "checkpoints not checked" in whats(report["warnings"])


@pytest.mark.parametrize(
    ("flavour", "transformers", "kind", "engine", "modules", "version"),
    [
        ("v2", "4.52.1", "2", "indextts2", ["indextts.infer_v2"], "2.0.0"),
        ("v25", "4.52.1", "2.5", "indextts2.5", ["indextts.infer_v2", "indextts.infer_v2_5"], "2.5.0"),
        ("pypi", "5.0.0", "pypi", "indextts2", ["indextts.infer_v2"], "2.1.1"),
    ],
)
def test_a_ready_venv_for_each_flavour(
    flavour: str, transformers: str, kind: str, engine: str, modules: list[str], version: str, tmp_path: Path
) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt", version="2.5" if kind == "2.5" else "2")
    report = doctor(doctor_env(tmp_path, flavour, transformers=transformers), ckpt)
    assert report["problems"] == [] and report["ok"] is True, report["problems"]
    assert report["checkpoints"]["engine"] == engine
    tts = report["indextts"]
    assert (tts["found"], tts["imports"], tts["flavour"], tts["engine"]) == (True, True, kind, engine)
    assert tts["modules"] == modules and tts["version"] == version
    assert tts["distribution"] == ("indextts2-inference" if kind == "pypi" else "indextts")
    assert report["packages"]["indextts"] == version
    assert report["transformers"]["status"] == "ok" and report["transformers"]["version"] == transformers
    assert report["torch"]["version"] == "2.8.0+standin" and report["torch"]["cuda_devices"] == ["Stand-in GPU 24GB"]
    ck = report["checkpoints"]
    assert ck["checked"] and ck["exists"] and ck["missing"] == [] and ck["hf_cache"] is True
    assert ck["model_dir"] == str(ckpt)
    # The stand-in prints when imported: that went to stderr, not into the report.
    assert "stand-in indextts.infer_v2" in report["_stderr"]


def test_transformers_5_conflicts_with_upstream(tmp_path: Path) -> None:
    report = doctor(doctor_env(tmp_path, "v2", transformers="5.1.0"), make_checkpoints(tmp_path / "ckpt"))
    assert report["ok"] is False and report["transformers"]["status"] == "conflict"
    (problem,) = report["problems"]
    assert "transformers 5.1.0 conflicts" in problem["what"] and "transformers==4.52.1" in problem["fix"]


@pytest.mark.parametrize(
    ("flavour", "transformers", "status"),
    [("v25", "4.51.3", "mismatch"), ("pypi", "4.52.1", "too_old")],
)
def test_other_transformers_versions_warn(flavour: str, transformers: str, status: str, tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt", version="2.5" if flavour == "v25" else "2")
    report = doctor(doctor_env(tmp_path, flavour, transformers=transformers), ckpt)
    assert report["ok"] is True and report["transformers"]["status"] == status
    assert f"transformers {transformers}" in whats(report["warnings"])


def test_transformers_missing_blocks(tmp_path: Path) -> None:
    report = doctor(doctor_env(tmp_path, "v2", transformers=None), make_checkpoints(tmp_path / "ckpt"))
    assert report["transformers"]["status"] == "missing"
    assert "transformers is not installed" in whats(report["problems"])


def test_missing_checkpoints_are_each_listed(tmp_path: Path) -> None:
    partial = make_checkpoints(tmp_path / "ckpt", skip=("gpt.pth", "feat1.pt", "qwen0.6bemo4-merge/"), hf_cache=False)
    report = doctor(doctor_env(tmp_path, "v2"), partial)
    ck = report["checkpoints"]
    assert ck["missing"] == ["gpt.pth", "feat1.pt", "qwen0.6bemo4-merge/"]
    assert set(ck["present"]) == set(CHECKPOINT_FILES) - {"gpt.pth", "feat1.pt"}
    problem, aux = report["problems"]
    assert "lacks: gpt.pth, feat1.pt, qwen0.6bemo4-merge/" in problem["what"]
    assert "hf download IndexTeam/IndexTTS-2" in problem["fix"]
    assert "hf_cache/campplus_cn_common.bin" in aux["what"] and "never downloads them" in aux["what"]
    assert "allow_download=true" in aux["fix"]


def test_without_qwen_an_environment_that_turned_it_off_is_fine(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt", skip=("qwen0.6bemo4-merge/",))
    raw = doctor(doctor_env(tmp_path, "v2"), ckpt)
    report = msgspec.convert({k: v for k, v in raw.items() if k != "_stderr"}, DoctorReport)
    assert exit_code(report) == 1 and "qwen0.6bemo4-merge/" in whats(raw["problems"])
    assert with_engine_options(report, {}) == report  # upstream's defaults load the Qwen model
    off = with_engine_options(report, {"use_qwen_emo": False})  # as setup records it
    assert exit_code(off) == 0 and off.ok and off.problems == []
    moved = [w for w in off.warnings if "qwen0.6bemo4-merge/" in w.what]
    assert len(moved) == 1 and "use_qwen_emo=false" in moved[0].fix
    # With another file missing beside it, the problem stays one.
    worse = make_checkpoints(tmp_path / "worse", skip=("gpt.pth", "qwen0.6bemo4-merge/"))
    (tmp_path / "again").mkdir()
    raw = doctor(doctor_env(tmp_path / "again", "v2"), worse)
    report = msgspec.convert({k: v for k, v in raw.items() if k != "_stderr"}, DoctorReport)
    assert exit_code(with_engine_options(report, {"use_qwen_emo": False})) == 1


def test_a_checkpoint_of_the_other_version_is_a_problem(tmp_path: Path) -> None:
    report = doctor(doctor_env(tmp_path, "v2"), make_checkpoints(tmp_path / "ckpt", version="2.5"))
    assert report["ok"] is False and report["checkpoints"]["model_version"] == "2.5"
    assert report["checkpoints"]["missing"] == []
    assert "has no code for IndexTTS-2.5 checkpoints (it has: indextts.infer_v2)" in whats(report["problems"])


def test_qwen_folder_is_optional_on_25(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt", skip=("qwen0.6bemo4-merge/",), version="2.5")
    report = doctor(doctor_env(tmp_path, "v25"), ckpt)
    assert report["ok"] is True and report["checkpoints"]["missing"] == []
    assert "qwen0.6bemo4-merge/" in report["checkpoints"]["optional_missing"]
    assert "emotion from text" in whats(report["warnings"])


def test_absent_checkpoint_directory(tmp_path: Path) -> None:
    report = doctor(doctor_env(tmp_path, "v2"), tmp_path / "nowhere")
    assert report["checkpoints"]["exists"] is False and report["checkpoints"]["missing"] == ALL_ENTRIES
    assert "does not exist" in whats(report["problems"])


def test_no_accelerator_is_a_warning(tmp_path: Path) -> None:
    report = doctor(doctor_env(tmp_path, "v2", cuda=False), make_checkpoints(tmp_path / "ckpt"))
    assert report["ok"] is True and report["torch"]["cuda_available"] is False
    assert "no CUDA, MPS or XPU device" in whats(report["warnings"])


def test_an_indextts_that_fails_to_import(tmp_path: Path) -> None:
    broken = tmp_path / "broken" / "indextts"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "infer_v2.py").write_text(
        "raise ImportError(\"cannot import name 'OffloadedCache' from 'transformers.cache_utils'\")\n"
    )
    env = doctor_env(tmp_path, None, transformers="5.0.0")
    env["PYTHONPATH"] = os.pathsep.join([str(broken.parent), env["PYTHONPATH"]])
    report = doctor(env, make_checkpoints(tmp_path / "ckpt"))
    tts = report["indextts"]
    assert tts["found"] and tts["flavour"] == "2" and tts["imports"] is False
    assert "OffloadedCache" in tts["error"] and "transformers==4.52.1" in tts["error"]
    assert report["transformers"]["status"] == "conflict"
    fixes = "\n".join(p["fix"] for p in report["problems"])
    assert "pip install transformers==4.52.1" in fixes


# ----------------------------------------------------------------- the client side


def _rendered(report: DoctorReport) -> str:
    buffer = io.StringIO()
    render(report, Console(file=buffer, width=200, color_system=None))
    return buffer.getvalue()


@pytest.mark.anyio
async def test_run_doctor_with_a_ready_venv(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt", version="2.5")
    with anyio.fail_after(60):
        report = await run_doctor(sys.executable, str(ckpt), env=doctor_env(tmp_path, "v25"))
    assert isinstance(report, DoctorReport) and report.ran and report.ok
    assert report.indextts.flavour == "2.5" and report.checkpoints.missing == []
    assert exit_code(report) == 0
    text = _rendered(report)
    for expected in ("IndexTTS-2.5", "--engine indextts2.5", "Stand-in GPU 24GB", "4.52.1", "ready to synthesize"):
        assert expected in text, text


@pytest.mark.anyio
async def test_run_doctor_with_blocking_problems(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        report = await run_doctor(
            sys.executable, str(tmp_path / "nowhere"), env=doctor_env(tmp_path, None, torch=False)
        )
    assert report.ran and not report.ok and exit_code(report) == 1
    text = _rendered(report)
    assert "indextts is not installed" in text and "does not exist" in text and "fix:" in text
    assert f"{len(report.problems)} problems block synthesis" in text


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "what", "fix"),
    [
        ("echo 'No module named indextts_sidecar' >&2; exit 1", "exited with code 1", "install indextts-sidecar"),
        ("echo 'error: unrecognized arguments: --doctor' >&2; exit 2", "exited with code 2", "upgrade"),
        ("echo 'not json'", "printed no report", "bug"),
        ('echo \'{"doctor": "x"}\'', "does not decode", "same indextts-sidecar version"),
    ],
)
async def test_run_doctor_when_the_doctor_fails(body: str, what: str, fix: str, tmp_path: Path) -> None:
    with anyio.fail_after(30):
        report = await run_doctor(_script(tmp_path, body), None)
    assert not report.ran and exit_code(report) == 2
    (problem,) = report.problems
    assert what in problem.what and fix in problem.fix
    assert "could not run" in _rendered(report)


@pytest.mark.anyio
async def test_run_doctor_without_an_interpreter(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        report = await run_doctor(str(tmp_path / "no-such-python"), None)
    assert not report.ran and exit_code(report) == 2
    assert "--python" in report.problems[0].fix


@pytest.mark.anyio
async def test_run_doctor_is_bounded_in_time(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        report = await run_doctor(_script(tmp_path, "exec sleep 600"), None, time_limit=0.5)
    assert not report.ran and "did not finish within 0.5 s" in report.problems[0].what


def test_doctor_command_prints_the_table_and_returns_the_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in doctor_env(tmp_path, "v2").items():
        monkeypatch.setenv(key, value)
    ckpt = make_checkpoints(tmp_path / "ckpt")
    assert doctor_command(sys.executable, str(ckpt)) == 0
    out = capsys.readouterr().out
    assert "indextts-sidecar doctor" in out and "IndexTTS-2" in out and "ready to synthesize" in out
    assert doctor_command(sys.executable, str(tmp_path / "nowhere")) == 1


def test_report_schema_round_trips() -> None:
    report = DoctorReport(ok=True)
    assert msgspec.json.decode(msgspec.json.encode(report), type=DoctorReport) == report
    # Fields added by a newer sidecar are ignored by an older client.
    assert msgspec.json.decode(b'{"ok": true, "new_field": 1}', type=DoctorReport).ok is True


# ----------------------------------------------------------------- other engines


def test_an_espeak_venv_is_judged_on_espeak_alone(tmp_path: Path) -> None:
    # No torch, no indextts, no transformers: none of that is espeak's business.
    env = doctor_env(tmp_path, None, torch=False, transformers=None, cuda=False)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env["PYTHONPATH"], *sys.path] if p)
    command = [sys.executable, "-m", "indextts_sidecar", "--doctor", "--engine", "espeak"]
    out = subprocess.run(command, capture_output=True, env=env, timeout=60, stdin=subprocess.DEVNULL, check=True)
    report = json.loads(out.stdout)
    assert report["ok"] is True and report["problems"] == [] and report["warnings"] == []
    assert report["engine"] == "espeak" and report["engine_info"]["available"] is True
    assert report["engine_info"]["native_sample_rate"] == 22050


@pytest.mark.anyio
async def test_run_doctor_for_an_engine_that_cannot_run(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        good = await run_doctor(sys.executable, None, engine="fake")
        bad = await run_doctor(sys.executable, None, engine="no-such-engine")
    assert good.ok and exit_code(good) == 0 and "ready to synthesize" in _rendered(good)
    assert "engine fake" in _rendered(good)
    assert not bad.ok and exit_code(bad) == 1
    assert "engine 'no-such-engine' cannot run here: LookupError: unknown engine" in bad.problems[0].what


def test_a_fix_command_is_never_wrapped_mid_line() -> None:
    command = "pip install transformers==4.52.1 in this venv " + "x" * 80
    report = DoctorReport(problems=[Problem(what="w", fix=command)])
    buffer = io.StringIO()
    render(report, Console(file=buffer, width=40, color_system=None))
    assert f"    fix: {command}\n" in buffer.getvalue()


# ----------------------------------------------------------------- the table agrees with the list


def _row(report: DoctorReport, check: str) -> tuple[str, str, str]:
    from indextts_client._doctor import _rows

    return next(row for row in _rows(report) if row[0] == check)


def test_the_table_says_warning_where_the_list_does(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt", skip=("qwen0.6bemo4-merge/",))
    raw = doctor(doctor_env(tmp_path, "v2"), ckpt)
    report = msgspec.convert({k: v for k, v in raw.items() if k != "_stderr"}, DoctorReport)
    assert _row(report, "checkpoints")[1] == "problem"  # upstream's defaults: the list says problem too
    off = with_engine_options(report, {"use_qwen_emo": False})
    assert off.problems == [] and _row(off, "checkpoints")[1] == "warning"
    text = _rendered(off)
    assert "problem" not in text and "warning" in text and "ready to synthesize" in text


def test_missing_auxiliary_models_are_a_problem_in_the_table_too(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt", hf_cache=False)
    raw = doctor(doctor_env(tmp_path, "v2"), ckpt)
    report = msgspec.convert({k: v for k, v in raw.items() if k != "_stderr"}, DoctorReport)
    assert "lacks auxiliary models" in whats(raw["problems"])
    _, status, detail = _row(report, "checkpoints")
    assert status == "problem" and "hf_cache/campplus_cn_common.bin" in detail


def test_the_pypi_repackagings_fix_never_offers_use_qwen_emo(tmp_path: Path) -> None:
    # indextts2-inference has no use_qwen_emo: it always loads the Qwen model.
    ckpt = make_checkpoints(tmp_path / "ckpt", skip=("qwen0.6bemo4-merge/",))
    report = doctor(doctor_env(tmp_path, "pypi", transformers="5.0.0"), ckpt)
    (problem,) = [p for p in report["problems"] if "qwen0.6bemo4-merge/" in p["what"]]
    assert "use_qwen_emo" not in problem["fix"] and "hf download IndexTeam/IndexTTS-2" in problem["fix"]
    (upstream,) = [p for p in doctor(doctor_env(tmp_path / "v2", "v2"), ckpt)["problems"] if "qwen" in p["what"]]
    assert "use_qwen_emo=false" in upstream["fix"]  # upstream's IndexTTS-2 does take it


@pytest.mark.parametrize("engine", ["fake", "espeak"])
def test_doctor_for_another_engine_without_python_checks_this_interpreter(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from indextts_client._cli import main

    monkeypatch.setenv("INDEXTTS_HOME", str(tmp_path / "home"))  # no environment registered
    code = main(["doctor", "--engine", engine])
    out, err = capsys.readouterr()
    assert "setup indextts2" not in out + err and code in (0, 1)
    assert f"engine {engine}" in out and sys.executable in out
