"""Sidecars on a local Ray Serve cluster: replicas of the fake engine, through RayClient.

Needs Ray (extra ``[ray]``), which the project's own test venv does not have: ``bash
.ci/ray`` builds a venv with it (cached) and runs this file.  Without Ray, it is skipped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import anyio
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed here: `bash .ci/ray` runs these tests in a Ray venv")
from ray import serve  # noqa: E402
from ray_support import ROOT, TIMEOUT  # noqa: E402

from indextts_client import InvalidRequestError, SentenceEnd, WordTiming  # noqa: E402
from indextts_client.ray import RayClient, deployment, http_ingress  # noqa: E402
from indextts_sidecar.engines.fake import render_bytes  # noqa: E402
from indextts_sidecar.engines.fake import words as fake_words  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def test_the_example_runs() -> None:
    """examples/ray_serve.py starts its own local cluster."""
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "ray_serve.py"), "fake", "2"],
        # RAY_ADDRESS=local: its own one-node cluster, not the suite's.
        env={**os.environ, "PYTHONPATH": ROOT, "RAY_ADDRESS": "local"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert re.search(r"^1\.86 s of audio at 24000 Hz$", done.stdout, re.M), done.stdout  # 31 characters
    assert len(re.findall(r"^chunk \d+: \d+ samples$", done.stdout, re.M)) >= 2


def timings(text: str) -> tuple[WordTiming, ...]:
    """The fake engine's words for ``text`` at 24 kHz, as the client gives them."""
    return tuple(
        WordTiming(text[w.start_char : w.end_char], (w.start_char, w.end_char), w.start / 24000, w.end / 24000)
        for w in fake_words(text)
    )


def run(app: Any, name: str) -> Any:
    return serve.run(app, name=name, route_prefix=None)


@pytest.mark.anyio
async def test_two_replicas_share_requests_and_stream(cluster: dict[str, Any]) -> None:
    handle = run(deployment("fake", num_replicas=2, num_cpus=0.5, max_ongoing_requests=1), "two")
    client = RayClient(handle)
    with anyio.fail_after(TIMEOUT):
        # Each replica takes one request at a time: four slow ones must use both.
        pids = set()

        async def one(i: int) -> None:
            result = await handle.synthesize.remote(f"text {i}", delay=0.2)
            assert result.samples == render_bytes(f"text {i}")
            pids.add(result.pid)

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(one, i)
        assert len(pids) == 2

        # The sidecar's typed errors reach the caller as such (Ray's wrapper is an instance of them).
        with pytest.raises(InvalidRequestError) as empty:
            await client.synthesize("   ")
        assert empty.value.code == "invalid_input"
        audio = await client.synthesize("hello ray")
        assert audio.samples.tobytes() == render_bytes("hello ray") and audio.sample_rate == 24000
        assert audio.words == timings("hello ray")  # the replica's word timings come back
        received = b""
        stream = client.stream("a streamed text", chunk_seconds=0.2)
        async with stream as chunks:
            seqs, carried = [], []
            async for chunk in chunks:
                received += chunk.samples.tobytes()
                seqs.append(chunk.seq)
                carried.extend(chunk.words)
        assert received == render_bytes("a streamed text") and seqs == list(range(len(seqs))) and len(seqs) > 1
        assert tuple(carried) == stream.words == timings("a streamed text")
    serve.delete("two")


@pytest.mark.anyio
async def test_stream_text_speaks_fragments_as_ordered_sentences(cluster: dict[str, Any]) -> None:
    handle = run(deployment("fake", num_replicas=1, num_cpus=0.5), "text")
    client = RayClient(handle)
    sentences = ["Hello there.", "How are you?", "Fine, thanks."]
    text = " ".join(sentences)
    fragments = [text[i : i + 5] for i in range(0, len(text), 5)]  # cut mid-word and mid-sentence

    async def trickle() -> Any:
        for fragment in fragments:
            await anyio.lowlevel.checkpoint()
            yield fragment

    with anyio.fail_after(TIMEOUT):
        received: dict[int, bytes] = {}
        ends: dict[int, tuple[WordTiming, ...]] = {}
        async with client.stream_text(trickle(), chunk_seconds=0.2) as stream:
            async for event in stream.events():
                if isinstance(event, SentenceEnd):
                    assert event.text == sentences[event.sentence]
                    ends[event.sentence] = event.words
                else:
                    received[event.sentence] = received.get(event.sentence, b"") + event.samples.tobytes()
    assert received == {i: render_bytes(s) for i, s in enumerate(sentences)}
    assert ends == {i: timings(s) for i, s in enumerate(sentences)}  # each sentence's words, from its replica
    serve.delete("text")


@pytest.mark.anyio
async def test_cancelling_the_caller_cancels_the_request_on_the_sidecar(cluster: dict[str, Any]) -> None:
    # One replica, one request at a time: the second request can only run if the first,
    # which would hang forever, was cancelled on the sidecar.
    handle = run(deployment("fake", num_replicas=1, num_cpus=0.5, max_ongoing_requests=1), "cancel")
    client = RayClient(handle)
    with anyio.fail_after(TIMEOUT):
        await client.ping()  # started
        with anyio.move_on_after(3):
            await client.synthesize("abcdefghij", chunk_seconds=0.2, hang_at=1)
            pytest.fail("a hung request returned")
        audio = await client.synthesize("after")
        assert audio.samples.tobytes() == render_bytes("after")
    serve.delete("cancel")


@pytest.mark.anyio
async def test_a_replica_whose_sidecar_died_is_replaced(cluster: dict[str, Any]) -> None:
    app = deployment("fake", num_replicas=1, num_cpus=0.5, health_check_period_s=0.5, health_check_timeout_s=5)
    handle = run(app, "replace")
    client = RayClient(handle)
    with anyio.fail_after(TIMEOUT):
        before = (await client.ping()).pid
        os.kill(before, signal.SIGKILL)
        # Serve notices through check_health and starts a new replica with a new sidecar.
        # Waiting for another system to recover is a bounded poll, nothing else to wait on.
        while True:
            try:
                after = (await client.ping()).pid
            except Exception:  # the dying replica answers with its error until replaced
                after = before
            if after != before:
                break
            await anyio.sleep(0.2)
        audio = await client.synthesize("replaced")
        assert audio.samples.tobytes() == render_bytes("replaced")
    serve.delete("replace")


def test_ray_client_under_trio(cluster: dict[str, Any]) -> None:
    """Ray's handles do not run under trio: RayClient waits in a worker thread there."""
    handle = run(deployment("fake", num_replicas=1, num_cpus=0.5), "trio")

    async def main() -> bytes:
        with anyio.fail_after(TIMEOUT):
            client = RayClient(handle)
            audio = await client.synthesize("from trio")
            received = b""
            async with client.stream("streamed in trio", chunk_seconds=0.2) as chunks:
                async for chunk in chunks:
                    received += chunk.samples.tobytes()
            assert received == render_bytes("streamed in trio")
            return audio.samples.tobytes()

    started = time.monotonic()
    assert anyio.run(main, backend="trio") == render_bytes("from trio")
    assert time.monotonic() - started < TIMEOUT
    serve.delete("trio")


@pytest.mark.anyio
async def test_the_http_app_as_the_deployments_ingress(cluster: dict[str, Any]) -> None:
    port = cluster["http_port"]
    httpx = pytest.importorskip("httpx")
    run(deployment("fake", num_replicas=1, num_cpus=0.5), "sidecars")
    serve.run(http_ingress("sidecars", api_key="k3y-for-tests"), name="http", route_prefix="/")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as http:
        with anyio.fail_after(TIMEOUT):
            body = {"model": "indextts", "input": "over ray", "voice": "alloy", "response_format": "wav"}
            health = await http.get("/health")
            while health.status_code == 503:  # "starting" while it asks the deployment
                await anyio.sleep(0.05)
                health = await http.get("/health")
            refused = await http.post("/v1/audio/speech", json=body)
            assert refused.status_code == 401
            headers = {"Authorization": "Bearer k3y-for-tests"}
            wav = await http.post("/v1/audio/speech", json=body, headers=headers)
            assert wav.status_code == 200, wav.text
            assert wav.content[:4] == b"RIFF" and wav.content[44:] == render_bytes("over ray")
            pcm = await http.post("/v1/audio/speech", json={**body, "response_format": "pcm"}, headers=headers)
            assert pcm.content == render_bytes("over ray")  # the fake engine runs at 24 kHz already
            # The replica reports its engine's speed control, so speed works through Ray too:
            # speed 2.0 halves the fake engine's seconds per character.
            fast = await http.post(
                "/v1/audio/speech", json={**body, "response_format": "pcm", "speed": 2.0}, headers=headers
            )
            assert fast.status_code == 200, fast.text
            assert fast.content == render_bytes("over ray", seconds_per_char=0.03)
            assert (await http.get("/health")).json() == {"status": "ok"}  # details need the key
            health = await http.get("/health", headers=headers)
            assert health.status_code == 200 and health.json()["replica"]["pid"] > 0
    serve.delete("http")
    serve.delete("sidecars")
