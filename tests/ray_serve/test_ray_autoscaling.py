"""Autoscaling on queued audio, drain on removal, voice-affine routing: on the suite's cluster.

The policy's arithmetic is checked on its own first (no cluster: these run wherever Ray
is installed); then deployments of the fake engine show each behaviour end to end.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed here: `bash .ci/ray` runs these tests in a Ray venv")
from ray import serve  # noqa: E402
from ray_support import TIMEOUT  # noqa: E402

from indextts_client.ray import (  # noqa: E402
    AudioAutoscaling,
    QueuedAudioPolicy,
    RayClient,
    deployment,
    estimate_seconds,
)
from indextts_sidecar.engines.fake import render_bytes  # noqa: E402

pytestmark = pytest.mark.timeout(300)
#: The fake engine speaks 0.06 s per character: 1 / 0.06 characters per second.
FAKE_CPS = 1 / 0.06


def context(metrics: dict[str, dict[str, float]], queued: float, lowest: int = 1, highest: int = 8) -> Any:
    return SimpleNamespace(
        aggregated_metrics=metrics,
        total_queued_requests=queued,
        capacity_adjusted_min_replicas=lowest,
        capacity_adjusted_max_replicas=highest,
    )


def test_the_policy_counts_held_and_queued_audio() -> None:
    policy = QueuedAudioPolicy(target_audio_seconds=10, default_request_seconds=4)
    held = {"r1": 12.0, "r2": 3.0}
    means = {"r1": 2.0, "r2": 3.0}
    metrics = {"indextts_audio_seconds": held, "indextts_mean_request_seconds": means}
    # 15 s held + 4 queued requests at the replicas' mean of 2.5 s = 25 s: 3 replicas of 10 s.
    replicas, state = policy(context(metrics, queued=4))
    assert replicas == 3 and state == {"audio_seconds": 25.0, "queued_audio_seconds": 10.0, "per_request_seconds": 2.5}
    # Nothing seen yet: a queued request counts as default_request_seconds.
    assert policy(context({}, queued=6))[0] == math.ceil(6 * 4 / 10)
    # Exactly the target is one replica, not two; idle is the minimum; the maximum caps.
    assert policy(context({"indextts_audio_seconds": {"r1": 10.0}}, queued=0))[0] == 1
    assert policy(context({}, queued=0, lowest=2))[0] == 2
    assert policy(context({}, queued=1000, highest=5))[0] == 5


def test_the_estimate_and_the_settings_are_checked() -> None:
    assert estimate_seconds("x" * 30, 15.0) == 2.0
    assert estimate_seconds("   ", 15.0) == 1 / 15  # never nothing: a request costs something
    for bad, why in (
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas <= max_replicas"),
        ({"target_audio_seconds": 0}, "must be > 0"),
        ({"chars_per_second": -1}, "must be > 0"),
        ({"downscale_delay_s": -1}, "must be >= 0"),
        ({"metrics_interval_s": 0}, "metrics_interval_s must be > 0"),
    ):
        with pytest.raises(ValueError, match=why):
            AudioAutoscaling(**bad)
    with pytest.raises(ValueError, match="not both"):
        deployment("fake", num_replicas=2, autoscaling=AudioAutoscaling())
    config = AudioAutoscaling(max_replicas=3, target_audio_seconds=20).serve_config()
    assert config["max_replicas"] == 3 and config["policy"]["policy_function"] is QueuedAudioPolicy
    assert config["policy"]["policy_kwargs"] == {"target_audio_seconds": 20, "default_request_seconds": 10.0}


def replica_counts(app: str) -> dict[str, int]:
    status = serve.status().applications[app].deployments["indextts"]
    return {str(state): count for state, count in status.replica_states.items()}


def running(app: str) -> int:
    return replica_counts(app).get("RUNNING", 0)


@pytest.mark.anyio
# Ray 2.60 still reads only this field for how often metrics are reported, and warns that it will go.
@pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning")
async def test_autoscaling_follows_queued_audio_up_and_back_down(cluster: dict[str, Any]) -> None:
    scaling = AudioAutoscaling(
        min_replicas=1,
        max_replicas=3,
        target_audio_seconds=4.0,  # two 2-second requests per replica
        chars_per_second=FAKE_CPS,
        upscale_delay_s=0.5,
        downscale_delay_s=2.0,
        look_back_period_s=1.0,
        metrics_interval_s=0.5,
    )
    app = deployment("fake", autoscaling=scaling, num_cpus=0.25, max_ongoing_requests=2)
    handle = serve.run(app, name="auto", route_prefix=None)
    client = RayClient(handle)
    text = "a burst request of audio"  # 24 characters: 1.44 s of audio
    assert running("auto") == 1
    peak = 1

    async def watch(until: anyio.Event) -> None:
        nonlocal peak
        while not until.is_set():
            peak = max(peak, running("auto"))
            await anyio.sleep(0.1)

    with anyio.fail_after(TIMEOUT):
        # The burst: 24 requests of 0.25 s per chunk, 3 chunks each, two at a time per
        # replica: about 9 s on one replica, the rest queued at the handle.
        done = anyio.Event()
        results: list[bytes] = []

        async def one(i: int) -> None:
            audio = await client.synthesize(f"{text} {i:02d}", chunk_seconds=0.5, delay=0.25)
            results.append(audio.samples.tobytes())
            assert audio.samples.tobytes() == render_bytes(f"{text} {i:02d}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, done)
            async with anyio.create_task_group() as burst:
                for i in range(24):
                    burst.start_soon(one, i)
            done.set()
        assert len(results) == 24
        assert peak >= 2, f"the deployment never scaled up: {replica_counts('auto')}"

        # After it: a trickle of requests, one at a time, while the deployment scales back
        # to one replica.  Each must be answered in full, the drained replicas' included.
        served = 0
        while running("auto") > 1 or replica_counts("auto").get("STOPPING", 0):
            async with client.stream(f"trickle {served}", chunk_seconds=0.2) as chunks:
                received = b"".join([chunk.samples.tobytes() async for chunk in chunks])
            assert received == render_bytes(f"trickle {served}")
            served += 1
        assert replica_counts("auto") == {"RUNNING": 1}
        audio = await client.synthesize("after the scale-down")
        assert audio.samples.tobytes() == render_bytes("after the scale-down")
    serve.delete("auto")


@pytest.mark.anyio
async def test_a_removed_replica_finishes_its_streams_before_it_goes(cluster: dict[str, Any]) -> None:
    # Two replicas, two requests each at most: four streams fill both.  Then the deployment
    # is redeployed with one replica: the other drains, and every stream ends complete.
    def app(replicas: int) -> Any:
        return deployment(
            "fake", num_replicas=replicas, num_cpus=0.25, max_ongoing_requests=2, graceful_shutdown_timeout_s=60
        )

    client = RayClient(serve.run(app(2), name="drain", route_prefix=None))
    texts = [f"stream number {i} of four" for i in range(4)]
    received: dict[int, bytes] = {}
    started = [anyio.Event() for _ in texts]

    async def one(i: int) -> None:
        async with client.stream(texts[i], chunk_seconds=0.2, delay=0.3) as chunks:
            data = b""
            async for chunk in chunks:
                data += chunk.samples.tobytes()
                started[i].set()
        received[i] = data

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for i in range(len(texts)):
                tg.start_soon(one, i)
            for event in started:
                await event.wait()
            # Every stream is under way, two on each replica: remove one replica.
            await anyio.to_thread.run_sync(lambda: serve.run(app(1), name="drain", route_prefix=None))
        assert received == {i: render_bytes(t) for i, t in enumerate(texts)}
        assert replica_counts("drain") == {"RUNNING": 1}
    serve.delete("drain")


@pytest.mark.anyio
async def test_a_voice_goes_back_to_the_replica_that_has_it_warm(cluster: dict[str, Any], tmp_path: Path) -> None:
    # Two requests per replica: with one, a replica whose request has just returned can still
    # count it for a moment, look full, and send the next request for its voice elsewhere.
    app = deployment("fake", num_replicas=2, num_cpus=0.25, max_ongoing_requests=2, max_voices_per_replica=32)
    handle = serve.run(app, name="voices", route_prefix=None)
    client = RayClient(handle)
    voices = []
    for k in range(16):
        path = tmp_path / f"voice{k}.wav"
        path.write_bytes(b"RIFF")
        voices.append(str(path))

    with anyio.fail_after(TIMEOUT):
        # The first time each voice is spoken (through the handle, as RayClient sends it, to
        # see the replica): a miss wherever it lands.
        home = {}
        for voice in voices:
            result = await handle.options(multiplexed_model_id=voice).synthesize.remote("first", voice=voice)
            assert result.facts["voice_cache"] == "miss"
            home[voice] = result.pid
        assert len(set(home.values())) == 2  # the router gives a new voice to the replica with fewer
        # Serve's routers learn which replica has which voice a moment later, through its
        # controller: a bounded poll with pings (a ping does not make a voice warm) until
        # every voice's ping reaches its replica.
        while True:
            probes = {v: (await handle.options(multiplexed_model_id=v).ping.remote()).pid for v in voices}
            if probes == home:
                break
            await anyio.sleep(0.1)
        # Every later request goes to the replica that spoke the voice.  Without affinity
        # about half of the second round and a quarter of the third would land on the other.
        misses = 0
        for _ in range(2):
            for voice in voices:
                audio = await client.synthesize("again", voice=voice)
                assert audio.samples.tobytes() == render_bytes("again")
                misses += audio.facts["voice_cache"] == "miss"
        assert misses == 0

    serve.delete("voices")
