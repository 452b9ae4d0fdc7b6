"""The same-output speed-ups of the GPT and of s2mel (issue 42, point 1; docs/indextts.md "The
same output, faster") against the real upstream code on the tiny fixtures, every flavour:
``probe_gpt_fast.py`` drives the adapter in the flavour's venv, and the tests here judge what it
recorded.

Greedy decoding with a seed, upstream's three beams and one beam, lone and in a batch of two: the
speed-ups decode the same codes as upstream's path and give the same audio within one int16 step
(oneDNN adds in another order than MKL; the DiT's tail runs over fewer frames); taken off again,
upstream's path gives the very same samples.  The beam cache keeps what transformers'
``DynamicCache`` keeps, operation by operation.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import numpy as np
import pytest
from conftest import HERE, flavour_named
from test_prefix_cache import NOISE, spread
from test_profile import run_probe

#: One tiny load and nine short requests.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", params=["2", "2.5", "pypi2", "pypi2.5"])
def report(request: pytest.FixtureRequest, checkpoints: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    name = request.param
    ckpt = checkpoints(flavour_named(name))
    out = tmp_path_factory.mktemp(f"gpt-fast-{name}")
    version = name.removeprefix("pypi")
    done: subprocess.CompletedProcess[str] = run_probe(
        name, ckpt, str(HERE / "probe_gpt_fast.py"), version, str(ckpt), str(out)
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-3000:]
    return {"name": name, **json.loads((out / "report.json").read_text())}


def outputs(run: dict[str, Any]) -> list[tuple[list[list[int]], list[int]]]:
    """(codes, samples) of each request: the two alone, then the two of the batch."""
    lone = [(r["codes"], r["samples"]) for r in run["lone"]]
    together = run["batch"]
    return lone + [(together["codes"], samples) for samples in together["samples"]]


def test_the_speedups_decode_what_upstream_does(report: Any) -> None:
    off, on = outputs(report["off"]), outputs(report["on"])
    for (codes_off, samples_off), (codes_on, samples_on) in zip(off, on, strict=True):
        assert codes_on == codes_off and len(codes_off) >= 1 and all(len(row) == 8 for row in codes_off)
        a, b = np.asarray(samples_off, dtype=np.int64), np.asarray(samples_on, dtype=np.int64)
        assert a.shape == b.shape and a.size > 0
        assert int(np.abs(a - b).max()) <= 1
    # The check above can fail: the two requests' texts reach the GPT's first logits.  (Not
    # necessarily its codes, nor 2.5's audio, which its codes alone decide: a tiny random 2.5's
    # argmax hardly hears the text; test_prefix_cache.py says more.)
    first, second = report["off"]["lone"]
    assert spread(first, second) > 100 * NOISE


def test_taken_off_they_leave_upstreams_path_as_it_was(report: Any) -> None:
    assert report["restored"] == report["off"]
    assert report["off_float_weights"] > 0 and report["on_float_weights"] == 0


def test_the_engine_reports_which_are_on(report: Any) -> None:
    assert report["off_info"] == {
        "gpt_speedups": {"packed_linear": "off", "beam_cache": "off"},
        "s2mel_speedups": {"tail_crop": "off", "last_layer_crop": "off", "mask_skip": "off", "weight_norm_once": "off"},
    }
    s2mel = report["installed_s2mel"]
    assert s2mel["tail_crop"] == s2mel["last_layer_crop"] == s2mel["mask_skip"] == "on"
    if report["name"] == "pypi2.5":  # the repackaging folds the weight norm into the weights at load
        assert s2mel["weight_norm_once"] == "its DiT has no weight-norm hooks"
    else:
        assert s2mel["weight_norm_once"] == "on"
    info = report["installed"]
    assert info["packed_linear"] == "on" and report["on_float_weights"] == 0
    if report["name"].startswith("pypi"):  # transformers 5: another Cache, not the one extended here
        assert "DynamicCache" in info["beam_cache"]
    else:
        assert info["beam_cache"] == "on"


def test_the_beam_cache_keeps_what_dynamic_cache_keeps(report: Any) -> None:
    cache = report["cache"]
    if report["name"].startswith("pypi"):
        assert cache is None
        return
    assert cache["equal"] is True and cache["checks"] > 300 and cache["moved"] > 100
    assert cache["length"] == 5 + 300 - 2 + 3 + 1  # its buffers laid anew several times on the way


def test_the_dits_tail_runs_over_the_new_frames_only(report: Any) -> None:
    off, on = report["off_frames"], report["on_frames"]
    # Off: the WaveNet sees every frame the transformer sees (the reference's 3 s, 258 frames, and the new ones).
    assert off["wavenet"] == off["transformer"] > 258
    # On: the reference's frames but the WaveNet's reach (one layer of width 5 in the tiny DiT) are cropped.
    assert on["transformer"] == off["transformer"]
    assert on["wavenet"] == on["transformer"] - 258 + 4


def test_the_last_layer_runs_over_the_tails_frames_only(report: Any) -> None:
    off, on = report["off_frames"], report["on_frames"]
    assert off["last_feed_forward"] == off["transformer"]
    assert on["last_feed_forward"] == on["wavenet"] < on["transformer"]


def test_attention_drops_only_a_mask_that_masks_nothing(report: Any) -> None:
    off, on = report["off_frames"], report["on_frames"]
    if report["name"] == "pypi2.5":  # the repackaging's DiT gives its attention no mask at all
        assert off["masked"] == on["masked"] == 0 and on["unmasked"] == off["unmasked"] > 0
    else:  # off: every call of the DiT's attention reads its mask; on: a lone request's masks nothing
        assert off["masked"] > 0 and off["unmasked"] == 0
        assert on["unmasked"] == off["masked"] and on["masked"] == 0
    # Two rows, one shorter: its mask masks frames, so it is kept (the estimate is upstream's).
    a, b = np.asarray(report["off_masked_rows"]), np.asarray(report["on_masked_rows"])
    assert a.shape == b.shape == (2, a.shape[1]) and a.shape[1] > 0
    assert float(np.abs(a - b).max()) <= 1e-5 * max(1.0, float(np.abs(a).max()))
