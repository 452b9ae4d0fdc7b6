"""``/metrics`` as Prometheus reads it: parsed by prometheus_client's own parser, with the
latency histograms per engine and member counting exactly the requests served."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
parser = pytest.importorskip("prometheus_client.parser")

from http_support import TIMEOUT, Server, server, speech  # noqa: E402

HISTOGRAMS = (
    "indextts_queue_wait_seconds",
    "indextts_time_to_first_audio_seconds",
    "indextts_total_seconds",
    "indextts_real_time_factor",
    "indextts_segment_seconds",
    "indextts_sidecar_phase_seconds",
    "indextts_engine_stage_seconds",
)


def _families(running: Server) -> dict[str, Any]:
    text = httpx.get(running.base + "/metrics", timeout=TIMEOUT).text
    return {family.name: family for family in parser.text_string_to_metric_families(text)}


def _counts(family: Any) -> dict[tuple[tuple[str, str], ...], float]:
    """Each label set's ``_count``."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for sample in family.samples
        if sample.name.endswith("_count")
    }


@pytest.fixture
def running() -> Iterator[Server]:
    with server("--engine", "fake", "--size", "2") as s:
        yield s


def test_metrics_parse_and_count_each_request_per_engine_and_member(running: Server) -> None:
    # 3 chunks each (0.24 s in chunks of 0.1 s): 2 segment gaps per request.
    bodies = [
        speech(input="abcd", response_format="wav", options={"chunk_seconds": 0.1}),
        speech(input="abcd", response_format="pcm", options={"chunk_seconds": 0.1}),
        speech(input="abcd", response_format="pcm", stream_format="sse", options={"chunk_seconds": 0.1}),
        speech(input="abcd", response_format="mp3", options={"chunk_seconds": 0.1}),
    ]
    with httpx.Client(base_url=running.base, timeout=TIMEOUT) as http:
        for body in bodies:
            answer = http.post("/v1/audio/speech", json=body)
            assert answer.status_code == 200
        refused = http.post("/v1/audio/speech", json=speech(input="abcd", options={"nope": 1}))
        assert refused.status_code == 400
    families = _families(running)
    for name in HISTOGRAMS:
        assert families[name].type == "histogram", name
    served = len(bodies)
    for name in ("indextts_queue_wait_seconds", "indextts_total_seconds", "indextts_real_time_factor"):
        counts = _counts(families[name])
        assert sum(counts.values()) == served, (name, counts)
        for labels in counts:
            engine, member = dict(labels)["engine"], dict(labels)["member"]
            assert engine == "fake" and member in {"0", "1"}, labels
    # The refused request reached a sidecar and got no audio: counted nowhere but in its outcome.
    assert sum(_counts(families["indextts_time_to_first_audio_seconds"]).values()) == served
    assert sum(_counts(families["indextts_segment_seconds"]).values()) == 2 * served
    phases = _counts(families["indextts_sidecar_phase_seconds"])
    by_phase: dict[str, float] = {}
    for labels, count in phases.items():
        phase = dict(labels)["phase"]
        by_phase[phase] = by_phase.get(phase, 0) + count
    # Each member loaded its model as serve started (Pool.start), so no request waited on a load.
    assert by_phase == {"queued": served, "synthesis": served}
    # The engine's own stages: the fake reports one, render.
    stages = _counts(families["indextts_engine_stage_seconds"])
    assert {dict(labels)["stage"] for labels in stages} == {"render"} and sum(stages.values()) == served
    # Real-time factors are positive and the sums are consistent with the counts.
    rtf = {s.name: s.value for s in families["indextts_real_time_factor"].samples if not s.labels.get("le")}
    assert sum(v for k, v in rtf.items() if k.endswith("_sum")) > 0
    outcomes = {
        s.labels["outcome"]: s.value for s in families["indextts_requests"].samples if s.name.endswith("_total")
    }
    assert outcomes == {"200": served, "400": 1}


def test_buckets_are_cumulative_and_end_in_the_count(running: Server) -> None:
    with httpx.Client(base_url=running.base, timeout=TIMEOUT) as http:
        for _ in range(3):
            assert (
                http.post(
                    "/v1/audio/speech", json=speech(input="ab", response_format="wav", options={"chunk_seconds": 0.05})
                ).status_code
                == 200
            )
    for name in HISTOGRAMS:
        family = _families(running)[name]
        series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
        counts = _counts(family)
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
                series.setdefault(key, []).append((float(sample.labels["le"]), sample.value))
        assert series, name
        for key, buckets in series.items():
            values = [value for _, value in sorted(buckets)]
            assert values == sorted(values) and values[-1] == counts[key], (name, key)


def test_voice_cache_hits_and_misses_per_member(tmp_path: Any) -> None:
    # The fake engine reports a miss for a voice its process has not spoken with, then hits.
    clips = {}
    for name in ("alice", "bob"):
        clip = tmp_path / f"{name}.wav"
        clip.write_bytes(b"RIFF stand-in clip")
        clips[name] = clip
    voices = [f"--voice={name}={path}" for name, path in clips.items()]
    with (
        server("--engine", "fake", "--size", "1", *voices) as s,
        httpx.Client(base_url=s.base, timeout=TIMEOUT) as http,
    ):
        for voice in ("alice", "alice", "bob", "alice", "alloy"):
            body = {**speech(input="ab", response_format="wav"), "voice": voice}
            assert http.post("/v1/audio/speech", json=body).status_code == 200
        family = _families(s)["indextts_voice_cache"]
    counts = {
        (sample.labels["member"], sample.labels["result"]): sample.value
        for sample in family.samples
        if sample.name == "indextts_voice_cache_total"
    }
    # alloy is the engine's default voice: no conditioning, counted in neither.
    assert counts == {("0", "miss"): 2, ("0", "hit"): 2}
    assert all(sample.labels["engine"] == "fake" for sample in family.samples)
