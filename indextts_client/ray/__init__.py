"""Sidecars on a Ray Serve cluster (extra ``[ray]``).

::

    from ray import serve
    from indextts_client.ray import AudioAutoscaling, RayClient, deployment

    handle = serve.run(deployment("indextts2", num_gpus=1, python=ENGINE_PYTHON,
                                  engine_options={"model_dir": "/models/IndexTTS-2"},
                                  autoscaling=AudioAutoscaling(min_replicas=1, max_replicas=8)))
    client = RayClient(handle)                 # the Client's async API over the handle
    audio = await client.synthesize("Hello.", voice="/voices/alice.wav")

Each replica runs one sidecar through a :class:`Client` (under the engine venv's
``python`` when given: that venv needs no Ray).  Serve does the scheduling, scaling and
replacing:

* **Health.**  A replica's health is its sidecar's (``check_health`` pings it), and the
  client inside does not restart a dead sidecar itself (``max_restarts=0`` unless given),
  so Serve replaces a replica whose sidecar died.
* **Autoscaling** (:class:`AudioAutoscaling`) follows the audio the deployment has to
  produce, estimated from text length, not the request count.
* **Voice affinity.**  :class:`RayClient` sends each request's voice as Serve's multiplexed
  model id: Serve prefers a replica that served the voice lately (its conditioning is
  warm), and falls back to another when those are busy or gone.
* **Drain.**  A replica being removed (scaled down, redeployed) takes no new requests and
  finishes those it holds within ``graceful_shutdown_timeout_s``; then its sidecar closes.
* **Lost replicas.**  A request whose replica died (its node lost, its sidecar crashed)
  before any audio reached the caller is sent again, to another replica; a stream that
  already delivered audio ends with :class:`CrashedError`, as a :class:`Pool`'s does.

Replicas run on Ray's asyncio loop, and :class:`RayClient` runs natively on asyncio.
Ray's handles do not run under trio, so on trio each call waits for its response in a
worker thread; cancelling the caller cancels the response, and with it the request on the
sidecar, on both.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import logging
import math
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, Union

import anyio
import numpy as np

from .._audio import SAMPLE_DTYPE, Audio
from .._client import Client
from .._exceptions import CrashedError
from .._signature import CLIENT, REQUESTER, merge_options, same_parameters
from .._stream_text import DEFAULT_LOOKAHEAD, DEFAULT_MAX_SENTENCE_CHARS, TextInput, TextStream, client_session

try:
    import ray
    from ray import serve
    from ray.exceptions import RayActorError
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(f"indextts_client.ray needs the [ray] extra: pip install 'ray[serve]>=2.60' ({exc})") from exc

from .._service import ReplicaInfo, ReplicaPing
from ._calls import (
    RETRYABLE,
    RayStream,
    StreamChunk,
    StreamEnd,
    SynthesisResult,
    lost,
    resolved,
    word_rows,
    words_from_rows,
)

T = TypeVar("T")


def _expect(answer: object, kind: type[T]) -> T:
    """A replica's answer, which must be a ``kind`` (a replica of another version answers otherwise)."""
    if not isinstance(answer, kind):
        raise TypeError(f"a replica answered with a {type(answer).__name__}, not a {kind.__name__}")
    return answer


__all__ = [
    "AudioAutoscaling",
    "QueuedAudioPolicy",
    "RayClient",
    "SidecarReplica",
    "deployment",
    "estimate_seconds",
    "http_ingress",
]

log = logging.getLogger("indextts_client")


#: The replica's metrics, by name.
AUDIO_SECONDS = "indextts_audio_seconds"
REQUESTS = "indextts_requests"
MEAN_REQUEST_SECONDS = "indextts_mean_request_seconds"


class QueuedAudioPolicy:
    """Serve's autoscaling policy for :class:`AudioAutoscaling` (it runs in Serve's controller).

    Replicas = ceil((audio the replicas hold + audio queued at the handles) / target).  Each
    replica reports, through ``record_autoscaling_stats``, the audio seconds of the requests
    it holds (running or queued on its sidecar, estimated from their text), their count, and
    the mean size of its recent requests.  Requests still waiting at the callers' handles are
    only a count for Serve: each is taken to be the replicas' recent mean request
    (``default_request_seconds`` before any was seen).  Serve's wrapper around a custom
    policy applies the deployment's delays and scaling factors to the number returned.

    Serve pickles it by value into its controller: it uses the standard library only.
    """

    def __init__(self, target_audio_seconds: float, default_request_seconds: float) -> None:
        if target_audio_seconds <= 0 or default_request_seconds <= 0:
            raise ValueError("target_audio_seconds and default_request_seconds must be > 0")
        self.target_audio_seconds = float(target_audio_seconds)
        self.default_request_seconds = float(default_request_seconds)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        held = sum(metrics.get(AUDIO_SECONDS, {}).values())
        means = [m for m in metrics.get(MEAN_REQUEST_SECONDS, {}).values() if m > 0]
        per_request = sum(means) / len(means) if means else self.default_request_seconds
        queued = max(0.0, float(ctx.total_queued_requests or 0.0)) * per_request
        demand = held + queued
        wanted = math.ceil(demand / self.target_audio_seconds - 1e-9)
        lowest, highest = ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas
        replicas = max(lowest, min(highest, wanted))
        return replicas, {"audio_seconds": demand, "queued_audio_seconds": queued, "per_request_seconds": per_request}


@dataclasses.dataclass(frozen=True)
class AudioAutoscaling:
    """Autoscaling on the audio a deployment has to produce (``deployment(autoscaling=...)``).

    Serve keeps ``ceil(audio seconds / target_audio_seconds)`` replicas, within
    ``min_replicas``..``max_replicas``.  The audio seconds are those of the requests the
    replicas hold (running or queued on their sidecars), each estimated as its text length
    over ``chars_per_second``, plus those queued at the callers' handles, each counted as
    the replicas' recent mean request (``default_request_seconds`` before any was seen).
    The other fields are Serve's own (``AutoscalingConfig``): how long a wish to scale
    up or down must last, the window metrics are averaged over, how often replicas report.
    """

    min_replicas: int = 1
    max_replicas: int = 4
    #: Audio seconds one replica should hold: its share of the queue.  For IndexTTS on one
    #: GPU (a few times real time), 60 s of audio is 15-30 s of waiting for the last request.
    target_audio_seconds: float = 60.0
    #: Speech rate of the estimate: about 15 for English, 4-5 for Chinese characters.
    chars_per_second: float = 15.0
    default_request_seconds: float = 10.0
    initial_replicas: Union[int, None] = None
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 300.0
    look_back_period_s: float = 10.0
    #: How often replicas and handles report (Serve's default, 10 s, when None).  Serve 2.60
    #: marks the field deprecated (a DeprecationWarning when set) but still reads only it.
    metrics_interval_s: Union[float, None] = None

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        positive = ("target_audio_seconds", "chars_per_second", "default_request_seconds", "look_back_period_s")
        interval = self.metrics_interval_s
        if any(not getattr(self, name) > 0 for name in positive) or (interval is not None and not interval > 0):
            raise ValueError(f"{', '.join(positive)} and metrics_interval_s must be > 0")
        if self.upscale_delay_s < 0 or self.downscale_delay_s < 0:
            raise ValueError("upscale_delay_s and downscale_delay_s must be >= 0")

    def serve_config(self) -> dict[str, Any]:
        """This as Serve's ``autoscaling_config``, with the queued-audio policy."""
        config: dict[str, Any] = {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "initial_replicas": self.initial_replicas,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "look_back_period_s": self.look_back_period_s,
            "policy": {
                "policy_function": QueuedAudioPolicy,
                "policy_kwargs": {
                    "target_audio_seconds": self.target_audio_seconds,
                    "default_request_seconds": self.default_request_seconds,
                },
            },
        }
        if self.metrics_interval_s is not None:
            config["metrics_interval_s"] = self.metrics_interval_s
        return config


def estimate_seconds(text: str, chars_per_second: float) -> float:
    """The audio a text will take, from its length (at least one character's worth)."""
    return max(1, len(text.strip())) / chars_per_second


class _Load:
    """The audio a replica holds: requests running or queued on its sidecar, estimated."""

    def __init__(self, chars_per_second: float) -> None:
        self.chars_per_second = chars_per_second
        self.seconds = 0.0
        self.requests = 0
        self.recent: collections.deque[float] = collections.deque(maxlen=64)

    @contextmanager
    def track(self, text: str) -> Iterator[None]:
        seconds = estimate_seconds(text, self.chars_per_second)
        self.seconds += seconds
        self.requests += 1
        self.recent.append(seconds)
        try:
            yield
        finally:
            self.requests -= 1
            self.seconds = max(0.0, self.seconds - seconds) if self.requests else 0.0

    def stats(self) -> dict[str, float]:
        mean = sum(self.recent) / len(self.recent) if self.recent else 0.0
        return {AUDIO_SECONDS: self.seconds, REQUESTS: float(self.requests), MEAN_REQUEST_SECONDS: mean}


class SidecarReplica:
    """One Serve replica: one sidecar behind a :class:`Client`, started on first use.

    ``replica_options``: ``chars_per_second`` (the load estimate reported to the autoscaler)
    and ``max_voices`` (how many voices it reports as warm, most recent first; 0: none).
    """

    def __init__(
        self,
        engine: Union[str, None],
        engine_options: dict[str, Any],
        client_kwargs: dict[str, Any],
        replica_options: Union[dict[str, Any], None] = None,
    ) -> None:
        options = dict(replica_options or {})
        kwargs = {"max_restarts": 0, **client_kwargs}
        self._client = Client(engine, engine_options=engine_options, **kwargs)
        self._started: Union[asyncio.Task[None], None] = None
        self._load = _Load(float(options.get("chars_per_second", AudioAutoscaling.chars_per_second)))
        max_voices = int(options.get("max_voices", 0))
        self._warm: Any = None
        if max_voices > 0:

            async def warm(voice: str) -> str:
                # The sidecar's engine caches a voice's conditioning when it first speaks it;
                # this only tells Serve's routers that this replica has the voice.
                return voice

            self._warm = serve.multiplexed(max_num_models_per_replica=max_voices)(warm)

    async def _ready(self) -> Client:
        if self._started is None:
            self._started = asyncio.ensure_future(self._client.start())
        await asyncio.shield(self._started)
        return self._client

    async def _note_voice(self) -> None:
        if self._warm is not None:
            voice = serve.get_multiplexed_model_id()
            if voice:
                await self._warm(voice)

    async def synthesize(self, text: str, **kwargs: Any) -> SynthesisResult:
        client = await self._ready()
        await self._note_voice()
        with self._load.track(text):
            audio = await client.synthesize(text, **kwargs)
        return SynthesisResult(
            samples=audio.samples.tobytes(),
            sample_rate=audio.sample_rate,
            timings=dict(audio.timings),
            facts=dict(audio.facts),
            words=word_rows(audio.words),
            pid=client.pid,
        )

    async def stream(self, text: str, **kwargs: Any) -> AsyncIterator[Union[StreamChunk, StreamEnd]]:
        client = await self._ready()
        await self._note_voice()
        with self._load.track(text):
            synthesis = client.stream(text, **kwargs)
            async with synthesis as chunks:
                async for chunk in chunks:
                    yield StreamChunk(
                        samples=chunk.samples.tobytes(),
                        sample_rate=chunk.sample_rate,
                        seq=chunk.seq,
                        offset_samples=chunk.offset_samples,
                        words=word_rows(chunk.words),
                    )
            yield StreamEnd(
                words=word_rows(synthesis.words), timings=dict(synthesis.timings), facts=dict(synthesis.facts)
            )

    async def info(self) -> ReplicaInfo:
        """The sidecar's ready facts: engine, capabilities, native rate, speed control (None: none)."""
        client = await self._ready()
        info = client.info
        return ReplicaInfo(
            engine=info.engine, capabilities=tuple(info.capabilities), sample_rate=info.sample_rate, speed=info.speed
        )

    async def ping(self) -> ReplicaPing:
        """The sidecar's health, its pid, and the Ray node and audio load of this replica."""
        client = await self._ready()
        health = await client.ping()
        return ReplicaPing(
            pid=client.pid,
            loaded=health.loaded,
            queue_depth=health.queue_depth,
            memory=dict(health.memory),
            round_trip=health.round_trip,
            node_id=str(ray.get_runtime_context().get_node_id()),
            audio_seconds=self._load.seconds,
        )

    async def check_health(self) -> None:
        """Serve's health check: the sidecar must be alive and answer a ping."""
        client = await self._ready()
        if client.dead or client.closed:
            raise RuntimeError("the sidecar is dead")
        with anyio.fail_after(10):
            await client.ping()

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What :class:`AudioAutoscaling`'s policy reads: the audio this replica holds."""
        return self._load.stats()

    async def __del__(self) -> None:
        # Serve calls this after the drain: the requests this replica held have finished
        # (or graceful_shutdown_timeout_s ran out).
        await self._client.aclose()


def deployment(
    engine: Union[str, None],
    *,
    engine_options: Union[dict[str, Any], None] = None,
    num_replicas: int = 1,
    num_gpus: float = 0,
    num_cpus: float = 1,
    resources: Union[dict[str, float], None] = None,
    max_ongoing_requests: int = 4,
    max_queued_requests: int = -1,
    autoscaling: Union[AudioAutoscaling, None] = None,
    max_voices_per_replica: int = 8,
    health_check_period_s: float = 5.0,
    health_check_timeout_s: float = 15.0,
    graceful_shutdown_timeout_s: float = 60.0,
    graceful_shutdown_wait_loop_s: float = 1.0,
    name: str = "indextts",
    **client_kwargs: Any,
) -> Any:
    """A Ray Serve application whose replicas each run one sidecar of ``engine``.

    ``client_kwargs`` go to each replica's :class:`Client` (``python``, ``env``, timeouts...).
    With ``num_gpus=1`` Ray gives each replica one GPU and sets its ``CUDA_VISIBLE_DEVICES``,
    which the sidecar inherits; ``resources`` are Ray custom resources each replica needs
    (``{"tts_slot": 1}`` places replicas only on the nodes started with that resource).

    ``autoscaling`` replaces the fixed ``num_replicas`` by :class:`AudioAutoscaling`.
    ``max_ongoing_requests`` is how many requests one replica holds at once (the rest wait
    at the handles, where a new replica can take them); ``max_queued_requests`` bounds those
    (-1: no bound), beyond which a call fails at once with Serve's ``BackPressureError``.
    ``max_voices_per_replica``: how many recent voices a replica reports as warm for
    voice-affine routing (match the engine's voice cache; 0 turns affinity off).
    A replica being removed finishes what it holds within ``graceful_shutdown_timeout_s``
    (checking every ``graceful_shutdown_wait_loop_s``), then closes its sidecar.
    """
    if autoscaling is not None and num_replicas != 1:
        raise ValueError("give num_replicas or autoscaling, not both")
    options: dict[str, Any] = {"num_gpus": num_gpus, "num_cpus": num_cpus}
    if resources:
        options["resources"] = dict(resources)
    settings: dict[str, Any] = {
        "name": name,
        "max_ongoing_requests": max_ongoing_requests,
        "max_queued_requests": max_queued_requests,
        "ray_actor_options": options,
        "health_check_period_s": health_check_period_s,
        "health_check_timeout_s": health_check_timeout_s,
        "graceful_shutdown_timeout_s": graceful_shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": graceful_shutdown_wait_loop_s,
    }
    if autoscaling is None:
        settings["num_replicas"] = num_replicas
    else:
        settings["autoscaling_config"] = autoscaling.serve_config()
    chars_per_second = (autoscaling or AudioAutoscaling()).chars_per_second
    replica_options = {"chars_per_second": chars_per_second, "max_voices": max_voices_per_replica}
    cls = serve.deployment(**settings)(SidecarReplica)
    return cls.bind(engine, dict(engine_options or {}), client_kwargs, replica_options)


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
        from ..http import create_app

        handle = serve.get_deployment_handle(deployment_name, app_name=app_name)
        return create_app(ray=RayClient(handle), api_key=api_key, voices=voice_map)

    ingress = serve.deployment(name=f"{deployment_name}-http", num_replicas=num_replicas)(serve.ingress(build)())
    return ingress.bind()


class RayClient:
    """The Client's async API (``synthesize``, ``stream``, ``ping``) over a deployment handle.

    A request whose replica was lost before any audio reached the caller (its actor or node
    died, its sidecar crashed) is sent again, ``retries`` times (default once); Serve's router
    has dropped the dead replica by then, so another one takes it.  A request with a
    ``voice`` asks for a replica that has the voice warm (see :func:`deployment`).
    """

    def __init__(self, handle: Any, *, retries: int = 1) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self._handle = handle
        self._retries = retries

    def _for(self, kwargs: dict[str, Any]) -> Any:
        voice = kwargs.get("voice")
        if isinstance(voice, str) and voice:
            return self._handle.options(multiplexed_model_id=voice)
        return self._handle

    @same_parameters(REQUESTER.synthesize)
    async def synthesize(self, text: str, **kwargs: Any) -> Audio:
        """As :meth:`Client.synthesize`, on the replica Serve picks (``on_progress`` is not available)."""
        kwargs = _remote(kwargs)
        handle = self._for(kwargs)
        for attempt in range(self._retries + 1):
            try:
                result = await resolved(handle.synthesize.remote(text, **kwargs))
                break
            except RETRYABLE as exc:
                if attempt == self._retries:
                    if isinstance(exc, RayActorError):
                        raise CrashedError(lost(exc, 0)) from exc
                    raise
                log.warning("a request lost its replica (%s); sending it again", type(exc).__name__)
        result = _expect(result, SynthesisResult)
        samples = np.frombuffer(result.samples, dtype=SAMPLE_DTYPE).copy()
        return Audio(
            samples=samples,
            sample_rate=result.sample_rate,
            timings=dict(result.timings),
            facts=dict(result.facts),
            words=words_from_rows(result.words),
        )

    async def info(self) -> ReplicaInfo:
        """A replica's sidecar facts: engine, capabilities, native rate, speed control."""
        return _expect(await resolved(self._handle.info.remote()), ReplicaInfo)

    async def ping(self) -> ReplicaPing:
        """One replica's answer (which one is Serve's choice): pid, loaded, queue depth, memory,
        its Ray node (``node_id``) and the audio seconds it holds."""
        return _expect(await resolved(self._handle.ping.remote()), ReplicaPing)

    @same_parameters(REQUESTER.stream)
    def stream(self, text: str, **kwargs: Any) -> RayStream:
        """``async with client.stream(text) as chunks: async for chunk in chunks``; leaving early cancels.

        ``on_progress`` is not available (it would run in the replica, unseen).  A stream whose
        replica is lost after it delivered audio raises :class:`CrashedError`: audio is never
        replayed twice.  Once it ended, the stream holds the request's ``words``, ``timings``
        and ``facts``, as a Client's does."""
        kwargs = _remote(kwargs)
        return RayStream(self._for(kwargs).options(stream=True), text, kwargs, self._retries)

    @same_parameters(CLIENT.stream_text)
    def stream_text(
        self,
        texts: TextInput,
        *,
        lookahead: int = DEFAULT_LOOKAHEAD,
        max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
        **kwargs: Any,
    ) -> TextStream:
        """As :meth:`Client.stream_text`: each sentence is one streamed call on the deployment, sent as
        soon as it is cut (Serve picks its replica: a voice is not held to one).  ``kwargs`` go to each."""
        kwargs = _remote(kwargs)  # refused here, before any sentence is sent

        def open_sentence(text: str) -> RayStream:
            return self.stream(text, **kwargs)

        return TextStream(
            client_session(open_sentence),
            texts,
            lookahead=lookahead,
            max_sentence_chars=max_sentence_chars,
            text_format=kwargs.get("text_format", "text"),
        )


#: The request methods' own parameters: every other keyword is an engine option.
_NAMED = frozenset(inspect.signature(REQUESTER.stream).parameters)


def _remote(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request's arguments as they cross to a replica: the engine options in one plain dict
    (``options`` and the keywords merged here, so a name given twice fails at the caller), refusing
    what cannot cross."""
    if kwargs.get("on_progress") is not None:
        # Pickled to the replica, the callback would run there and the caller would see nothing.
        raise TypeError("RayClient does not take on_progress: the callback would run in the replica")
    named = {k: v for k, v in kwargs.items() if k in _NAMED and k != "options"}
    keywords = {k: v for k, v in kwargs.items() if k not in _NAMED}
    options = merge_options(kwargs.get("options"), keywords)
    return {**named, "options": options} if options else named
