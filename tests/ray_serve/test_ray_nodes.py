"""Losing a node: the second node of .ci/ray's cluster is killed while requests stream.

It runs last (the cluster has one node after it).  Without .ci/ray's second node it skips.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed here: `bash .ci/ray` runs these tests in a Ray venv")
from ray import serve  # noqa: E402
from ray_support import SECOND_NODE, TIMEOUT  # noqa: E402

from indextts_client import CrashedError  # noqa: E402
from indextts_client.ray import RayClient, deployment  # noqa: E402
from indextts_sidecar.engines.fake import render_bytes  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(SECOND_NODE is None, reason="needs the two-node cluster that `bash .ci/ray` starts"),
]


def kill_node(pgid: int) -> int:
    """SIGKILL every process of a node, as if its machine were gone: the process group that
    .ci/ray started it in, and every descendant of those, since Ray starts its workers (and a
    replica its sidecar) in groups of their own.  A worker outside the group outlived its raylet
    long enough to finish streaming what it had begun.  Stopped first, so that nothing reacts to
    the others' deaths.  Returns how many processes it killed."""
    parents: dict[int, int] = {}
    groups: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                _state, parent, group = stat.read().rsplit(")", 1)[1].split()[:3]
        except OSError:
            continue  # gone meanwhile
        parents[int(entry)], groups[int(entry)] = int(parent), int(group)
    doomed = {pid for pid, group in groups.items() if group == pgid}
    while more := {pid for pid, parent in parents.items() if parent in doomed} - doomed:
        doomed |= more
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in doomed:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    return len(doomed)


@pytest.mark.anyio
async def test_a_node_killed_mid_stream_loses_no_request(
    cluster: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert SECOND_NODE is not None
    # One tts_slot per node: one replica on each, six requests each at most, so that the
    # twelve below are six on each node.
    app = deployment("fake", num_replicas=2, num_cpus=0.25, resources={"tts_slot": 1}, max_ongoing_requests=6)
    client = RayClient(serve.run(app, name="nodes", route_prefix=None))
    voice = tmp_path / "voice.wav"
    voice.write_bytes(b"RIFF")

    with anyio.fail_after(TIMEOUT):
        nodes = set()
        while len(nodes) < 2:  # which replica answers is Serve's choice: ask until both have
            nodes.add((await client.ping()).node_id)
        assert len(nodes) == 2

        texts = [f"request {i} across two nodes" for i in range(12)]
        streamed: dict[int, bytes] = {}
        lost: dict[int, int] = {}  # stream -> chunks it had when its replica was lost
        whole: dict[int, bytes] = {}
        # A sidecar runs one request at a time: two streams in the middle of their audio at once
        # are one on each node.  "In the middle": a chunk received and at least four still to
        # come (1.2 s at the sidecar's pace), since Ray delivers each stream on its own, so a
        # stream's last chunks can reach a loaded test process after its sidecar made them all
        # and began the next request.  Each replica holds six requests,
        # and twelve are sent: six wait on each node.
        active: set[int] = set()
        both = anyio.Event()
        chunk_bytes = round(0.2 * 24000) * 2

        async def stream(i: int) -> None:
            chunks = 0
            data = b""
            whole_length = len(render_bytes(texts[i]))
            try:
                async with client.stream(texts[i], chunk_seconds=0.2, delay=0.3) as audio:
                    async for chunk in audio:
                        data += chunk.samples.tobytes()
                        chunks += 1
                        if len(data) <= whole_length - 4 * chunk_bytes:
                            active.add(i)
                        else:
                            active.discard(i)
                        if len(active) >= 2:
                            both.set()
            except CrashedError:
                lost[i] = chunks
                return
            finally:
                active.discard(i)
            streamed[i] = data

        async def synthesize(i: int) -> None:
            # These deliver nothing before they finish: every one must come back whole.
            audio = await client.synthesize(texts[i], voice=str(voice), chunk_seconds=0.2, delay=0.3)
            whole[i] = audio.samples.tobytes()

        caplog.set_level(logging.WARNING, logger="indextts_client")
        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(stream, i)
            for i in range(6, 12):
                tg.start_soon(synthesize, i)
            await both.wait()
            # A stream with audio runs on each node, the other requests wait: the second node dies.
            assert kill_node(int(SECOND_NODE)) >= 3  # its raylet, the replica's worker, its sidecar...

        # Nothing is lost: every request comes back whole, from the head's replica if need be;
        # the one stream that had audio from the lost node ends with the Pool's error.
        assert whole == {i: render_bytes(texts[i]) for i in range(6, 12)}
        assert streamed == {i: render_bytes(texts[i]) for i in range(6) if i not in lost}
        assert len(lost) == 1 and min(lost.values()) >= 1, lost
        # Those waiting on the lost node (six, less the stream and at most one that ended
        # before it began) were sent again.
        resent = [r.getMessage() for r in caplog.records if "sending it again" in r.getMessage()]
        assert len(resent) >= 4, resent
        # The survivor serves on.
        audio = await client.synthesize("after the node", voice=str(voice))
        assert audio.samples.tobytes() == render_bytes("after the node")
    serve.delete("nodes")
