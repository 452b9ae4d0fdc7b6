"""Sidecars on a Ray Serve cluster (extra ``[ray]``).

::

    from ray import serve
    from indextts_client.ray import RayClient, deployment

    handle = serve.run(deployment("indextts2", num_replicas=4, num_gpus=1, python=ENGINE_PYTHON,
                                  engine_options={"model_dir": "/models/IndexTTS-2"}))
    client = RayClient(handle)                 # the Client's async API over the handle
    audio = await client.synthesize("Hello.", voice="/voices/alice.wav")

Each replica runs one sidecar through a :class:`Client` (under the engine venv's
``python`` when given: that venv needs no Ray).  Serve does the scheduling, scaling and
replacing: the replica's health is its sidecar's (``check_health`` pings it), and the
client inside does not restart a dead sidecar itself (``max_restarts=0`` unless given),
so Serve replaces a replica whose sidecar died.

:class:`RayClient` runs natively on asyncio.  Ray's handles do not run under trio, so on
trio each call waits for its response in a worker thread; cancelling the caller cancels
the response, and with it the request on the sidecar, on both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Union

import anyio
import numpy as np

from ._audio import SAMPLE_DTYPE, Audio, AudioChunk
from ._client import Client
from ._signature import CLIENT, REQUESTER, same_parameters
from ._stream_text import DEFAULT_LOOKAHEAD, DEFAULT_MAX_SENTENCE_CHARS, TextInput, TextStream, client_session

try:
    from ray import serve
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(f"indextts_client.ray needs the [ray] extra: pip install 'ray[serve]>=2.40' ({exc})") from exc

__all__ = ["RayClient", "SidecarReplica", "deployment", "http_ingress"]


class SidecarReplica:
    """One Serve replica: one sidecar behind a :class:`Client`, started on first use."""

    def __init__(self, engine: Union[str, None], engine_options: dict[str, Any], client_kwargs: dict[str, Any]) -> None:
        kwargs = {"max_restarts": 0, **client_kwargs}
        self._client = Client(engine, engine_options=engine_options, **kwargs)
        self._started: Union[asyncio.Task[None], None] = None

    async def _ready(self) -> Client:
        if self._started is None:
            self._started = asyncio.ensure_future(self._client.start())
        await asyncio.shield(self._started)
        return self._client

    async def synthesize(self, text: str, **kwargs: Any) -> dict[str, Any]:
        client = await self._ready()
        audio = await client.synthesize(text, **kwargs)
        return {
            "samples": audio.samples.tobytes(),
            "sample_rate": audio.sample_rate,
            "timings": audio.timings,
            "pid": client.pid,
        }

    async def stream(self, text: str, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        client = await self._ready()
        async with client.stream(text, **kwargs) as chunks:
            async for chunk in chunks:
                yield {
                    "samples": chunk.samples.tobytes(),
                    "sample_rate": chunk.sample_rate,
                    "seq": chunk.seq,
                    "offset_samples": chunk.offset_samples,
                }

    async def info(self) -> dict[str, Any]:
        """The sidecar's ready facts: engine, capabilities, native rate."""
        client = await self._ready()
        info = client.info
        return {"engine": info.engine, "capabilities": list(info.capabilities), "sample_rate": info.sample_rate}

    async def ping(self) -> dict[str, Any]:
        client = await self._ready()
        health = await client.ping()
        return {
            "pid": client.pid,
            "loaded": health.loaded,
            "queue_depth": health.queue_depth,
            "memory": health.memory,
            "round_trip": health.round_trip,
        }

    async def check_health(self) -> None:
        """Serve's health check: the sidecar must be alive and answer a ping."""
        client = await self._ready()
        if client.dead or client.closed:
            raise RuntimeError("the sidecar is dead")
        with anyio.fail_after(10):
            await client.ping()

    async def __del__(self) -> None:
        await self._client.aclose()


def deployment(
    engine: Union[str, None],
    *,
    engine_options: Union[dict[str, Any], None] = None,
    num_replicas: int = 1,
    num_gpus: float = 0,
    num_cpus: float = 1,
    max_ongoing_requests: int = 4,
    health_check_period_s: float = 5.0,
    health_check_timeout_s: float = 15.0,
    name: str = "indextts",
    **client_kwargs: Any,
) -> Any:
    """A Ray Serve application whose replicas each run one sidecar of ``engine``.

    ``client_kwargs`` go to each replica's :class:`Client` (``python``, ``env``, timeouts...).
    With ``num_gpus=1`` Ray gives each replica one GPU and sets its ``CUDA_VISIBLE_DEVICES``,
    which the sidecar inherits.
    """
    options = {"num_gpus": num_gpus, "num_cpus": num_cpus}
    cls = serve.deployment(
        name=name,
        num_replicas=num_replicas,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options=options,
        health_check_period_s=health_check_period_s,
        health_check_timeout_s=health_check_timeout_s,
    )(SidecarReplica)
    return cls.bind(engine, dict(engine_options or {}), client_kwargs)


def http_ingress(
    app_name: str,
    *,
    deployment_name: str = "indextts",
    api_key: Union[str, None] = None,
    voices: Union[dict[str, Union[str, None]], None] = None,
    num_replicas: int = 1,
) -> Any:
    """The OpenAI-compatible HTTP app (:mod:`indextts_client.http`) as a Ray Serve ingress in
    front of the sidecar deployment ``deployment_name`` of the application ``app_name``::

        serve.run(deployment("indextts2", ...), name="tts", route_prefix=None)
        serve.run(http_ingress("tts", api_key=KEY), name="tts-http", route_prefix="/")
    """
    voice_map = dict(voices or {})

    def build() -> Any:
        from .http import create_app

        handle = serve.get_deployment_handle(deployment_name, app_name=app_name)
        return create_app(ray=RayClient(handle), api_key=api_key, voices=voice_map)

    ingress = serve.deployment(name=f"{deployment_name}-http", num_replicas=num_replicas)(serve.ingress(build)())
    return ingress.bind()


class RayClient:
    """The Client's async API (``synthesize``, ``stream``, ``ping``) over a deployment handle."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    @same_parameters(REQUESTER.synthesize)
    async def synthesize(self, text: str, **kwargs: Any) -> Audio:
        """As :meth:`Client.synthesize`, on the replica Serve picks (``on_progress`` is not available)."""
        result = await _result(self._handle.synthesize.remote(text, **_remote(kwargs)))
        samples = np.frombuffer(result["samples"], dtype=SAMPLE_DTYPE).copy()
        return Audio(samples=samples, sample_rate=int(result["sample_rate"]), timings=dict(result["timings"]))

    async def info(self) -> dict[str, Any]:
        """A replica's sidecar facts: engine, capabilities, native rate."""
        result: dict[str, Any] = await _result(self._handle.info.remote())
        return result

    async def ping(self) -> dict[str, Any]:
        """One replica's answer (which one is Serve's choice): pid, loaded, queue depth, memory."""
        result: dict[str, Any] = await _result(self._handle.ping.remote())
        return result

    @same_parameters(REQUESTER.stream)
    @asynccontextmanager
    async def stream(self, text: str, **kwargs: Any) -> AsyncIterator[AsyncIterator[AudioChunk]]:
        """``async with client.stream(text) as chunks: async for chunk in chunks``; leaving early cancels.

        ``on_progress`` is not available (it would run in the replica, unseen)."""
        response = self._handle.options(stream=True).stream.remote(text, **_remote(kwargs))

        async def chunks() -> AsyncIterator[AudioChunk]:
            while True:
                item = await _next(response)
                if item is None:
                    return
                yield AudioChunk(
                    samples=np.frombuffer(item["samples"], dtype=SAMPLE_DTYPE),
                    sample_rate=int(item["sample_rate"]),
                    seq=int(item["seq"]),
                    offset_samples=int(item["offset_samples"]),
                )

        iterator = chunks()
        try:
            yield iterator
        finally:
            await iterator.aclose()  # type: ignore[attr-defined]
            response.cancel()

    @same_parameters(CLIENT.stream_text)
    def stream_text(self, texts: TextInput, **kwargs: Any) -> TextStream:
        """As :meth:`Client.stream_text`: each sentence is one streamed call on the deployment, sent as
        soon as it is cut (Serve picks its replica: a voice is not held to one).  ``kwargs`` go to each."""
        lookahead: int = kwargs.pop("lookahead", DEFAULT_LOOKAHEAD)
        max_sentence_chars: int = kwargs.pop("max_sentence_chars", DEFAULT_MAX_SENTENCE_CHARS)
        _remote(kwargs)  # refused here, before any sentence is sent

        def open_sentence(text: str) -> Any:
            return self.stream(text, **kwargs)

        return TextStream(
            client_session(open_sentence), texts, lookahead=lookahead, max_sentence_chars=max_sentence_chars
        )


_END = object()


def _remote(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request's arguments, refusing those that cannot cross to a replica."""
    if kwargs.get("on_progress") is not None:
        # Pickled to the replica, the callback would run there and the caller would see nothing.
        raise TypeError("RayClient does not take on_progress: the callback would run in the replica")
    return kwargs


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _result(response: Any) -> Any:
    """Await a DeploymentResponse on asyncio, or in a worker thread on trio; cancel it if we are."""
    if _on_asyncio():
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()
            raise
    try:
        return await anyio.to_thread.run_sync(response.result, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        response.cancel()
        raise


async def _next(response: Any) -> Any:
    """The next item of a DeploymentResponseGenerator, or None at its end."""
    if _on_asyncio():
        try:
            return await response.__anext__()
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            response.cancel()
            raise
    try:
        item = await anyio.to_thread.run_sync(lambda: next(response, _END), abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        response.cancel()
        raise
    return None if item is _END else item
