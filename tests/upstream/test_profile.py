"""The fast profile and its knobs (issue 42, docs/indextts.md "The fast profile"), against the real
upstream code on the tiny fixtures, and the precision gates' harness (``bench/precision_gates.py``).

``probe_profile.py`` drives the adapter in upstream's venv and records what upstream's s2mel
solver and GPT decoding were called with (steps, guidance rate, rows; beams); the tests here
judge it.  Whether this CPU has bf16 matrix instructions is read here from /proc/cpuinfo,
independently of the adapter's own check, and the test expects acceptance or refusal to match.
The option checks at the top need no upstream venv.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import HERE, ROOT, flavour_named

from indextts_sidecar import protocol
from indextts_sidecar._validate import RequestLimits, validate_synthesis
from indextts_sidecar.engines import EngineError
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine, IndexTTS25Options
from indextts_sidecar.engines.indextts._profile import FAST, request_knobs

#: A probe loads the tiny model twice and runs eight short requests; the harness twice, four.
pytestmark = pytest.mark.timeout(300)


def _code(engine: Any, options: dict[str, Any]) -> tuple[str, Any]:
    message = protocol.Synthesize(id=1, text="hi", voice=None, options=options)
    with pytest.raises(EngineError) as caught:
        validate_synthesis(engine, message, RequestLimits())
    return caught.value.code, caught.value.field


@pytest.mark.parametrize(
    ("options", "code", "field"),
    [
        ({"profile": "turbo"}, "invalid_option", "$.options.profile"),
        ({"profile": 1}, "invalid_option", "$.options.profile"),
        ({"diffusion_steps": 0}, "invalid_option", "$.options.diffusion_steps"),
        ({"diffusion_steps": 201}, "invalid_option", "$.options.diffusion_steps"),
        ({"cfg_rate": -0.1}, "invalid_option", "$.options.cfg_rate"),
        ({"cfg_rate": math.nan}, "invalid_option", "$.options.cfg_rate"),
        ({"num_beams": 0}, "invalid_option", "$.options.num_beams"),
        ({"bf16_s2mel": "yes"}, "invalid_option", "$.options.bf16_s2mel"),
        ({"bf16_vocoder": 1}, "invalid_option", "$.options.bf16_vocoder"),
        # Weights load once: bf16_weights is the engine's option, not a request's.
        ({"bf16_weights": True}, "unknown_option", None),
    ],
)
def test_bad_request_knobs_are_typed_errors(options: dict[str, Any], code: str, field: Any) -> None:
    engine = IndexTTS2Engine(msgspec.convert({}, IndexTTS2Engine.Options))
    got_code, got_field = _code(engine, options)
    assert got_code == code
    if field is not None:
        assert got_field == field


@pytest.mark.parametrize(
    "options",
    [
        {"profile": "turbo"},
        {"diffusion_steps": 0},
        {"cfg_rate": 11},
        {"bf16_weights": "yes"},
        {"bf16_s2mel": 2},
        {"num_beams": 0},
    ],
)
def test_bad_engine_knobs_are_refused(options: dict[str, Any]) -> None:
    # The sidecar answers these with invalid_option at start (msgspec.convert of -o, _main.py).
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(options, IndexTTS25Options, strict=False)


def test_knob_precedence() -> None:
    engine = msgspec.convert({"profile": "fast", "diffusion_steps": 4}, IndexTTS25Options)
    request = IndexTTS25Engine.RequestOptions
    none = msgspec.convert({}, request)
    assert request_knobs(engine, none) == ("fast", dataclasses.replace(FAST, diffusion_steps=4))
    # The request's profile sets the knobs afresh; its knobs override its profile's.
    assert request_knobs(engine, msgspec.convert({"profile": "default"}, request))[1].facts() == {}
    cfg = msgspec.convert({"profile": "fast", "cfg_rate": 0.3}, request)
    fast = {"diffusion_steps": 10, "cfg_rate": 0.3, "num_beams": 1}
    assert request_knobs(engine, cfg)[1].facts() == {**fast, "bf16_s2mel": True, "bf16_vocoder": True}
    # A device without bf16 matrix products: the profile's bf16 knobs are dropped, the rest kept.
    assert request_knobs(engine, cfg, bf16=False)[1].facts() == fast
    # The request's own bf16_s2mel=false over its profile's.
    off = msgspec.convert({"profile": "fast", "bf16_s2mel": False}, request)
    assert request_knobs(engine, off)[1].bf16_s2mel is False
    # Either bf16 knob alone still needs the interceptors.
    for name in ("bf16_s2mel", "bf16_vocoder"):
        assert request_knobs(msgspec.convert({name: True}, IndexTTS25Options), none)[1].s2mel
    # No knob is on by default.
    assert request_knobs(msgspec.convert({}, IndexTTS25Options), none) == ("default", type(FAST)())


def cpu_has_bf16() -> bool:
    """x86's AVX512-BF16 or AMX-BF16, ARM's BF16: the flags the adapter honours, read here."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags = set(value.split())
            break
    return bool(flags & ({"avx512_bf16", "amx_bf16"} if os.uname().machine == "x86_64" else {"bf16"}))


def run_probe(name: str, ckpt: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    flavour = flavour_named(name)
    # indextts2-inference reads its auxiliary models from the Hugging Face cache: the fixture's.
    extra = {"HF_HOME": str(ckpt / "hf_home")} if name == "pypi2" else {}
    return subprocess.run(
        [flavour.python, script, *args],
        env={**os.environ, **flavour.env(**extra)},
        capture_output=True,
        text=True,
        timeout=280,
        cwd=str(ROOT),
    )


@pytest.mark.parametrize("name", ["2", "2.5", "pypi2", "pypi2.5"])
def test_knobs_reach_upstream(name: str, checkpoints: Any, tmp_path: Path) -> None:
    """Every flavour: each passes the s2mel steps and rate to ``cfm.inference`` and pops ``num_beams``."""
    ckpt = checkpoints(flavour_named(name))
    version = name.removeprefix("pypi")
    done = run_probe(name, ckpt, str(HERE / "probe_profile.py"), version, str(ckpt), str(tmp_path))
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())

    knobs = report["knobs"]
    # Engine: profile=fast with diffusion_steps=4 (over the profile's 10).
    first, default, own = knobs["lone"]
    assert first["calls"] == [["gpt", 1], ["cfm", 1, 4, 0.0]]
    assert first["facts"]["profile"] == "fast"
    assert first["facts"]["knobs"] == {"diffusion_steps": 4, "cfg_rate": 0.0, "num_beams": 1}
    # profile=default on the request: upstream's 3 beams, 25 steps, guidance 0.7.
    assert default["calls"] == [["gpt", 3], ["cfm", 1, 25, 0.7]]
    assert default["facts"]["profile"] == "default" and default["facts"]["knobs"] == {}
    # The request's knobs over the engine's.
    assert own["calls"] == [["gpt", 2], ["cfm", 1, 4, 0.5]]
    assert own["facts"]["knobs"] == {"diffusion_steps": 4, "cfg_rate": 0.5, "num_beams": 2}
    assert all(r["samples"] > 0 for r in knobs["lone"])

    # A batch: two equal CFM rows share a solve when their knobs are equal, and never otherwise.
    same, apart = knobs["same"], knobs["apart"]
    assert [c for c in same["calls"] if c[0] == "cfm"] == [["cfm", 2, 25, 0.7]]
    assert sorted(c for c in apart["calls"] if c[0] == "cfm") == [["cfm", 1, 5, 0.7], ["cfm", 1, 25, 0.7]]
    assert apart["facts"][0]["knobs"] == {} and apart["facts"][1]["knobs"] == {"diffusion_steps": 5}
    assert apart["samples"][0] == apart["samples"][1] > 0

    # A CPU without the instructions (its flags read as such): an explicit ask is refused, named,
    # before any load; the profile loads without them.
    code, field, message, retryable = knobs["refused"]
    assert (code, field, retryable) == ("invalid_option", "bf16_weights", False)
    assert "no bf16 matrix instructions" in message
    assert knobs["info"]["profile"] == "fast" and knobs["info"]["bf16_weights"] is False
    assert knobs["gpt_dtypes"] == ["torch.float32"]
    # bf16_s2mel and bf16_vocoder likewise: the engine's refused at load, a request's refused, the
    # profile's dropped (the facts above, and every vocoder call in float32).
    for name in ("bf16_s2mel", "bf16_vocoder"):
        code, field, message, retryable = knobs[f"refused_{name}"]
        assert (code, field, retryable) == ("invalid_option", name, False)
        assert "no bf16 matrix instructions" in message
        code, field, message = knobs[f"refused_request_{name}"]
        assert (code, field) == ("invalid_option", f"$.options.{name}") and "no bf16 matrix instructions" in message
    assert knobs["lone_vocoder"] == [["vocoder", 1]] * 3
    # This CPU, as its flags say.
    bf16 = report["bf16"]
    if cpu_has_bf16():
        assert bf16["info"]["bf16_weights"] is True, bf16
        assert "torch.bfloat16" in bf16["gpt_dtypes"]
        assert bf16["facts"]["knobs"] == {"bf16_weights": True} and bf16["samples"] > 0
        # The GPT's linear layers in oneDNN's bf16 layout (packed_linear) under bf16_weights.
        assert bf16["info"]["gpt_speedups"]["packed_linear"] == "on", bf16["info"]
        # A request's bf16_s2mel: its solve under bf16 autocast, the GPT as before.
        s2mel = bf16["s2mel"]
        assert [c for c in s2mel["calls"] if c[0] == "cfm"] == [["cfm", 1, 25, 0.7, "bf16"]]
        assert s2mel["vocoder"] == [["vocoder", 1]]
        assert s2mel["facts"]["knobs"] == {"bf16_s2mel": True, "bf16_weights": True} and s2mel["samples"] > 0
        # A request's bf16_vocoder: its vocoder's wide convolutions in bf16, its solve in float32.
        vocoder = bf16["vocoder"]
        assert vocoder["vocoder"] == [["vocoder", 1, "bf16"]]
        assert [c for c in vocoder["calls"] if c[0] == "cfm"] == [["cfm", 1, 25, 0.7]]
        assert vocoder["facts"]["knobs"] == {"bf16_vocoder": True, "bf16_weights": True} and vocoder["samples"] > 0
        # In a batch, rows share a solve or a vocoder call only with the same precision.
        assert [c for c in bf16["bf16_same"]["calls"] if c[0] == "cfm"] == [["cfm", 2, 25, 0.7, "bf16"]]
        assert bf16["bf16_same"]["vocoder"] == [["vocoder", 2, "bf16"]]
        apart = sorted(c for c in bf16["bf16_apart"]["calls"] if c[0] == "cfm")
        assert apart == [["cfm", 1, 25, 0.7], ["cfm", 1, 25, 0.7, "bf16"]]
        assert sorted(bf16["bf16_apart"]["vocoder"]) == [["vocoder", 1], ["vocoder", 1, "bf16"]]
        assert bf16["bf16_same"]["samples"][0] == bf16["bf16_same"]["samples"][1] > 0
    else:
        code, field, message, retryable = bf16["error"]
        assert (code, field, retryable) == ("invalid_option", "bf16_weights", False)
        assert "bf16" in message


@pytest.mark.parametrize("name", ["2", "2.5"])
def test_gates_harness(name: str, checkpoints: Any, tmp_path: Path) -> None:
    ckpt = checkpoints(flavour_named(name))
    out = tmp_path / "gates.json"
    args = [name, str(ckpt), "--knob", "diffusion_steps=6", "--knob", "cfg_rate=0", "--tokens", "8"]
    # Gates required: token_match holds, mel_cosine cannot (above 1): the run reports it and fails.
    args += [
        "--texts",
        "Hello there.",
        "--json",
        str(out),
        "--require",
        "token_match=1",
        "--require",
        "mel_cosine=1.01",
    ]
    done = run_probe(name, ckpt, str(ROOT / "bench" / "precision_gates.py"), *args)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().endswith("failed: mel_cosine")
    assert "mel cosine" in done.stdout and "speed-up" in done.stdout  # the printed table
    report = json.loads(out.read_text())
    gates = report["gates"]
    assert set(gates) >= {"token_match", "mel_cosine", "mel_cosine_mean", "snr_db", "snr_db_mean", "speedup"}
    # Greedy and the same beams: the GPT's codes do not depend on the s2mel knobs.
    assert gates["token_match"] == 1.0
    assert -1.0 <= gates["mel_cosine"] < 1.0  # fewer steps, no guidance: another mel
    assert math.isfinite(gates["snr_db"]) and gates["speedup"] > 0
    assert report["calls"]["baseline"]["diffusion_steps"] == [25] and report["calls"]["candidate"][
        "diffusion_steps"
    ] == [6]
    assert report["calls"]["baseline"]["cfg_rate"] == [0.7] and report["calls"]["candidate"]["cfg_rate"] == [0.0]
    assert report["calls"]["baseline"]["num_beams"] == report["calls"]["candidate"]["num_beams"] == [3]
    assert report["facts"][0]["knobs"] == {"diffusion_steps": 6, "cfg_rate": 0.0, "num_beams": 3}
    (only,) = report["inputs"]
    assert only["samples"] == only["candidate_samples"] > 0 and len(only["mel_cosine"]) == 1
    assert report["failed"] == ["mel_cosine"] and report["required"] == {"token_match": 1.0, "mel_cosine": 1.01}
    # Request knobs only: one engine serves both paths, interleaved; one round, one ratio.
    assert report["interleaved"] is True and len(report["speedup_rounds"]) == 1
    assert report["speedup_rounds"][0] == pytest.approx(gates["speedup"])
