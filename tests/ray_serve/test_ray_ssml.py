"""SSML through RayClient on a local Ray Serve cluster (the fake engine): the replica's client
reads the SSML, its refusal crosses Ray as the typed SsmlError, and stream_text cuts an SSML
text only where no tag is open."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed here: `bash .ci/ray` runs these tests in a Ray venv")
pytest.importorskip("defusedxml", reason="the ssml extra (defusedxml) is not installed")

from ray import serve  # noqa: E402
from ray_support import TIMEOUT  # noqa: E402

from indextts_client import SsmlError  # noqa: E402
from indextts_client.ray import RayClient, deployment  # noqa: E402
from indextts_sidecar.engines.fake import render  # noqa: E402

pytestmark = pytest.mark.timeout(240)

SSML = '<speak>ab<break time="125ms"/><sub alias="cd">x</sub></speak>'
EXPECTED = np.concatenate([render("ab"), np.zeros(3000, "<i2"), render("cd")]).tobytes()


@pytest.mark.anyio
async def test_ray_client_speaks_ssml(cluster: dict[str, Any]) -> None:
    handle = serve.run(deployment("fake", num_replicas=1, num_cpus=0.5), name="ssml", route_prefix=None)
    client = RayClient(handle)
    with anyio.fail_after(TIMEOUT):
        audio = await client.synthesize(SSML, text_format="ssml")
        assert audio.samples.tobytes() == EXPECTED
        received = b""
        async with client.stream(SSML, text_format="ssml") as chunks:
            async for chunk in chunks:
                received += chunk.samples.tobytes()
        assert received == EXPECTED
        with pytest.raises(SsmlError) as caught:
            await client.synthesize("<speak><audio/></speak>", text_format="ssml")
        assert (caught.value.code, caught.value.line, caught.value.column) == ("unsupported", 1, 8)
        pieces = [SSML[i : i + 4] for i in range(0, len(SSML), 4)]  # tags cut across fragments
        spoken = b""
        async with client.stream_text(pieces, text_format="ssml") as stream:
            async for sentence_chunk in stream:
                spoken += sentence_chunk.samples.tobytes()
        assert spoken == EXPECTED
    serve.delete("ssml")
