"""bench/bench_gpu.py --small on the CPU: a real process, the real upstream code, its JSON checked.

The GPU benchmark is run on GPU machines only by hand (bench/gpu_run.sh); this keeps the script
itself working: every requested cell is there, measured or skipped with its reason, the
measured ones carry upstream's stage times and audio of the length the token budget asks for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, cached_checkpoint, expected_openmp, flavour_named

#: A --small run of both models is 5-10 minutes on 2 idle cores; a busy machine makes it slower.
pytestmark = pytest.mark.timeout(2400)

BENCH = ROOT / "bench" / "bench_gpu.py"


def run_bench(tmp_path: Path, models: list[str], ckpt_root: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "bench_gpu.json"
    flavour = flavour_named(models[0])
    command = [sys.executable, str(BENCH), "--small", "--device", "cpu", "--models", ",".join(models)]
    command += ["--ckpt-root", str(ckpt_root), "--out", str(out), *extra]
    env = {**os.environ, "INDEXTTS_UPSTREAM_PYTHON": flavour.python, "INDEXTTS_UPSTREAM_SRC": str(flavour.checkout)}
    # The environment of the suite's fork server (Flavour.env) for the bench's sidecars and probes.
    env["PYTHONUNBUFFERED"] = "1"
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=2300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "throughput: audio seconds per second" in done.stdout  # the printed table
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's cached tiny fixtures, linked where bench_gpu.py looks for them (kind = model)."""
    root = tmp_path_factory.mktemp("bench-ckpts")
    for model in ("2", "2.5"):
        flavour = flavour_named(model)
        source = cached_checkpoint(flavour, tmp_path_factory.mktemp(f"ckpt-{model}"))
        # bench_gpu.py writes warmup.wav beside the clips: a copy, so the cached fixture stays as built.
        target = root / model
        target.mkdir()
        for entry in source.iterdir():
            (target / entry.name).symlink_to(entry)
    return root


def test_small_run_covers_every_cell(tmp_path: Path, ckpt_root: Path) -> None:
    result = run_bench(
        tmp_path,
        ["2", "2.5"],
        ckpt_root,
        *("--sidecars", "1,2", "--concurrency", "1,2", "--overhead-rounds", "2", "--unbatched-at", "1"),
    )
    config = result["config"]
    assert config["size"] == "small" and config["device"] == "cpu"
    assert config["weights"].startswith("random")
    cells = result["cells"]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for cell in cells:
        assert cell["status"] in ("ok", "skipped"), cell
        if cell["status"] == "skipped":
            assert cell["reason"], cell
        by_kind.setdefault(cell["kind"], []).append(cell)

    # throughput: 2 models x 2 precisions x 2 accel settings x 3 texts, each present exactly once.
    keys = {(c["model"], c["precision"], c["accel"], c["text"]) for c in by_kind["throughput"]}
    expected = {
        (model, precision, accel, text)
        for model, half in (("2", "fp16"), ("2.5", "bf16"))
        for precision in ("fp32", half)
        for accel in (False, True)
        for text in ("short", "medium", "long")
    }
    assert keys == expected and len(by_kind["throughput"]) == len(expected)
    reached: set[str] = set()
    for cell in by_kind["throughput"]:
        if cell["precision"] != "fp32":
            assert cell["status"] == "skipped" and "off on the CPU" in cell["reason"]
        elif cell["accel"]:
            assert cell["status"] == "skipped" and "CUDA" in cell["reason"]
        else:
            assert cell["status"] == "ok", cell
            # The budget is the text's natural length (one segment; --small asks for a tenth of it,
            # config["scale"]): the audio never exceeds it.  Random weights run to it unless they
            # sample the stop token first (once in a CI run here: 1.00 s of 1.43), so each model must reach
            # it on at least one of its three texts, below.
            natural = config["texts"][cell["text"]]["natural_seconds"] * config["scale"]
            assert config["scale"] == 0.1
            assert 0 < cell["audio_seconds"]["max"] <= natural * 1.15 + 0.05, cell
            if cell["audio_seconds"]["min"] == pytest.approx(natural, rel=0.15, abs=0.05):
                reached.add(cell["model"])
            assert cell["audio_per_second"]["median"] > 0
            assert {"gpt", "s2mel", "vocoder", "total"} <= set(cell["stages"]), cell["stages"]
            assert cell["stages"]["total"]["median"] > 0
            assert cell["memory"]["rss"] > 0

    assert reached == {"2", "2.5"}, "no text of a model ran to its token budget"
    # floor: the machine's figures, each stage's floor, and the throughput cell's medium text over it.
    for model in ("2", "2.5"):
        (cell,) = [c for c in by_kind["floor"] if c["model"] == model]
        assert cell["status"] == "ok" and cell["threads"] >= 1, cell
        assert cell["openmp"] == expected_openmp(), cell  # OpenMP waits as in the sidecar
        assert cell["bandwidth"]["bytes_per_s"] > 0 and cell["matmul"]["flops_per_s"] > 0
        gpt = cell["gpt"]
        # One decoding step a token but the first (the prefill), one row (one beam).
        assert gpt["steps"] == cell["max_mel_tokens"] - 1 and gpt["weight_bytes"] > 0 and gpt["kv_bytes_per_row"] > 0
        steps = [gpt["step_s_by_rows"][rows] for rows in ("1", "2", "3", "4", "8")]
        assert steps == sorted(steps) and steps[0] > 0  # more rows read more KV, the weights once
        assert cell["s2mel"]["calls"] == cell["vocoder"]["calls"] == 1
        assert cell["s2mel"]["flops"] > cell["vocoder"]["flops"] > 0
        floor = result["floor"][model]
        assert floor["gpt_step_s"] == gpt["step_s_by_rows"]["3"]  # upstream's three beams
        assert floor["s2mel_s"] == cell["s2mel"]["s"] > 0 and floor["vocoder_s"] == cell["vocoder"]["s"] > 0
        assert set(floor["measured_over_floor"]) == {"gpt", "s2mel", "vocoder"}
        assert all(value > 0 for value in floor["measured_over_floor"].values())
        medium = [
            c for c in by_kind["throughput"] if c["model"] == model and c["text"] == "medium" and c["status"] == "ok"
        ]
        assert medium[0]["over_floor"] == floor["measured_over_floor"]
    for model in ("2", "2.5"):
        (stream,) = [c for c in by_kind["stream"] if c["model"] == model]
        assert stream["status"] == "ok" and stream["segments"] >= 2
        # Streamed with the engine's default for a stream (a first segment of 10 text tokens): the
        # same segments or one more.
        assert stream["first_segment_tokens"] == 10
        assert stream["segments_streamed"] in (stream["segments"], stream["segments"] + 1), stream
        assert 0 < stream["first_audio_streamed"]["median"] < stream["end_streamed"]["median"]
        assert stream["whole"]["median"] > 0
        check_natural_stops(stream, config["tokens_per_second"][model])
        caches = {c["voice_cache"]: c for c in by_kind["voice_cache"] if c["model"] == model}
        assert set(caches) == {4, 0} and all(c["status"] == "ok" for c in caches.values())
        assert all(c["first_round"]["n"] == 3 and c["first_round"]["median"] > 0 for c in caches.values())
        assert all(c["later_rounds"] is None for c in caches.values())  # one round: nothing later
        # The GPT prefill: each voice's first request, and the first voice's second (after the round).
        assert caches[4]["prefix_cache"] > 0 and caches[0]["prefix_cache"] == 0
        for cache in caches.values():
            prefill = cache["gpt_prefill"]
            assert prefill["first"]["n"] == 3 and prefill["second"]["n"] == 1 and prefill["first"]["median"] > 0
            assert prefill["second_over_first"] > 0
        fleet = {c["sidecars"]: c for c in by_kind["sidecars"] if c["model"] == model}
        assert set(fleet) == {1, 2}
        for count, cell in fleet.items():
            assert cell["status"] == "ok"
            assert cell["requests"] == count * config["rounds"]
            assert cell["aggregate_audio_per_second"] > 0
            assert len(cell["memory"]) == count and all(m["rss"] > 0 for m in cell["memory"])
    # batch: equal audio with greedy decoding, ratios per c against c = 1, memory per configuration.
    batch = result["batch"]
    assert batch["equal_to_unbatched"] == {"2": True, "2.5": True}, by_kind["batch"]
    for model in ("2", "2.5"):
        assert batch["throughput_ratio"][model]["1"] == 1.0 and batch["throughput_ratio"][model]["2"] > 0
        assert set(batch["first_audio_ratio"][model]) == {"1", "2"}
        assert set(batch["against_sidecars"][model]) == {"1", "2"}
        # --unbatched-at 1: the sidecar that does not batch ran its lone request only.
        assert set(batch["against_unbatched"][model]) == {"1"}
        assert batch["memory"][model]["batched"]["rss"] > 0
        for c in ("1", "2"):
            # batch_stages=gpt (the CPU's auto): the GPT batched, the CFM and vocoder row by row.
            assert set(batch["stage_throughput_ratio"][model][c]) == {"gpt"}
            assert all(value > 0 for value in batch["stage_throughput_ratio"][model][c].values())
            first = batch["first_audio_over_lone"][model][c]
            assert 0 < first["earliest"] <= first["median"]
        assert set(batch["memory_per_extra_row"][model]) == {"2"}
        assert batch["row_by_row_stages"][model] == ["s2mel", "vocoder"]
        # The bound the stages allow, and the measured throughput over it, per c.
        assert set(batch["bound"][model]) == {"1", "2"} and all(b > 0 for b in batch["bound"][model].values())
        over = batch["over_bound"][model]
        ratio = batch["throughput_ratio_over_lone"][model]
        assert over["2"] == pytest.approx(ratio["2"] / batch["bound"][model]["2"])
        (cell,) = [c for c in by_kind["batch"] if c["model"] == model]
        assert cell["batch_stages"] == "gpt" and cell["first_segment_tokens"] == 0  # auto, on the CPU; one segment
        assert cell["unbatched_at"] == [1] and set(cell["configurations"]["unbatched"]) == {"1"}
        for name, by_c in cell["configurations"].items():
            assert by_c["1"]["peak_memory"]["median"] > 0, name
        overhead = result["overhead"][model]
        assert overhead["n"] == 2 and overhead["median"] > 0
        # Upstream called directly waits for OpenMP's threads as the sidecar does (the same rule).
        (priced,) = [c for c in by_kind["overhead"] if c["model"] == model]
        assert priced["upstream_openmp"] == expected_openmp(), priced
        # mps: this machine has no NVIDIA driver, so the pool refuses the daemon and the cell says why.
        (mps,) = [c for c in by_kind["mps"] if c["model"] == model]
        assert mps["status"] == "skipped" and mps["sidecars"] == 2, mps
        assert mps["reason"].startswith("no MPS daemon: ") and "nvidia" in mps["reason"].lower(), mps


#: Upstream's silence after each segment of a request (``interval_silence``'s default, 200 ms).
SEGMENT_SILENCE = 0.2


def check_natural_stops(stream: dict[str, Any], tokens_per_second: float) -> None:
    """The stream cell's natural stops (bench/_natural_stop.py): each segment's GPT call capped at
    its text's natural length, never above the request's budget, and the audio no longer than that."""
    assert stream["natural_stop"] is True, stream
    per_segment = stream["max_mel_tokens_per_segment"]
    streamed, whole = stream["segment_caps_streamed"], stream["segment_caps_whole"]
    assert len(streamed) == stream["segments_streamed"] and len(whole) == stream["segments"], stream
    assert all(isinstance(cap, int) and 1 <= cap <= per_segment for cap in streamed + whole), stream
    # The whole request's first sentence is shorter than the request's budget (the whole long
    # text's, with natural stops): its cap is its own length, not the request's.
    assert whole[0] < per_segment, stream
    # The stream's first segment is the whole request's first, cut after 10 text tokens: a cap
    # below that segment's and below every later sentence's (the rest of the first sentence, its
    # second segment, may be shorter still), the two parts about as long as the sentence (each
    # rounded, less the space at the cut), and the later sentences capped as in the whole request.
    assert len(streamed) == len(whole) + 1, stream
    assert streamed[0] < whole[0] and all(streamed[0] < cap for cap in streamed[2:]), stream
    assert abs(streamed[0] + streamed[1] - whole[0]) <= 2, stream
    assert streamed[2:] == whole[1:], stream
    # The caps took effect: the audio is at most the capped codes' length (and the silence upstream
    # puts after each segment), less than every segment running to the budget would speak.
    capped = sum(streamed) / tokens_per_second + SEGMENT_SILENCE * len(streamed)
    assert sum(streamed) < per_segment * len(streamed)
    assert stream["audio_seconds"]["max"] <= capped + 0.05, stream


def test_budget_skips_the_cells_not_begun(tmp_path: Path, ckpt_root: Path) -> None:
    """A spent time budget still leaves every requested cell in the file, skipped with the reason."""
    result = run_bench(tmp_path, ["2"], ckpt_root, "--budget", "0", "--texts", "short", "--sidecars", "1,4")
    cells = result["cells"]
    kinds = sorted({c["kind"] for c in cells})
    assert kinds == ["batch", "floor", "mps", "overhead", "sidecars", "stream", "throughput", "voice_cache"]
    spent = [c for c in cells if c.get("reason") == "time budget spent"]
    assert {c["kind"] for c in spent} == set(kinds)
    assert {c["sidecars"] for c in cells if c["kind"] == "sidecars"} == {1, 4}
    assert all(c["status"] == "skipped" for c in cells)
