"""The app: the named parts (schema, encoders, voices, backends, limits) put together."""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Union

import anyio
import prometheus_client
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from .._pool import Pool
from ._backends import Backend, PoolBackend, RayBackend
from ._emotion import emotion_for
from ._errors import HTTPError, exception_handlers
from ._limits import Limits, LimitsMiddleware
from ._metrics import Metrics
from ._playground import Playground
from ._schema import VoiceRef, decode_speech, engine_options
from ._speech import Job, SpeechRoute
from ._voices import Voices
from ._websocket import WebSocketLimits
from ._websocket import WebSocketRoute as SpeechSocket

__all__ = ["create_app"]

log = logging.getLogger("indextts_client.http")


class _State:
    """``starting`` until the backend is up, then ``ok``; ``unavailable`` when it could not start."""

    def __init__(self) -> None:
        self.status = "starting"


class _Service:
    def __init__(self, backend: Backend, api_key: Union[str, None], model: str, voices: Voices, limits: Limits) -> None:
        self.backend, self.api_key, self.model, self.voices, self.limits = backend, api_key, model, voices, limits
        self.state = _State()
        self.metrics = Metrics()

    def authorized(self, request: HTTPConnection) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    def authorize(self, request: Request) -> None:
        if not self.authorized(request):
            raise HTTPError(401, "missing or wrong API key (Authorization: Bearer KEY)", code="invalid_api_key")

    def require_ready(self) -> None:
        if self.state.status == "starting":
            raise HTTPError(503, "the server is starting", code="starting", headers={"Retry-After": "1"})
        if self.state.status != "ok":
            raise HTTPError(503, "no sidecar could start", code="unavailable")

    async def prepare(self, request: Request) -> Job:
        self.authorize(request)
        self.require_ready()
        media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != "application/json":
            raise HTTPError(415, "the body must be application/json", code="bad_content_type")
        speech = decode_speech(await request.body(), self.limits.max_input)
        options = engine_options(speech.options)
        options.update(self.speed_options(speech.speed, options))
        emotion = await emotion_for(speech, self.backend.facts, self.voices.resolve)
        voice = speech.voice.id if isinstance(speech.voice, VoiceRef) else speech.voice
        return Job(speech, await self.voices.resolve(voice), options, emotion)

    def speed_options(self, speed: float, options: Mapping[str, Any]) -> dict[str, Any]:
        """``speed`` as the engine's declared option: 400 with the range when it is out of it."""
        if speed == 1.0:
            return {}
        facts = self.backend.facts
        control = facts.speed
        if control is None:
            raise HTTPError(400, f"engine {facts.name!r} has no speed control; speed must be 1.0", param="speed")
        if control.option in options:
            raise HTTPError(400, f"give speed or options.{control.option}, not both", param="speed")
        value = control.value(speed)
        if value is None:
            low, high = control.speed_range()
            raise HTTPError(
                400, f"speed {speed:g} is outside engine {facts.name!r}'s range [{low:.3g}, {high:.3g}]", param="speed"
            )
        return {control.option: value}

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "indextts"}]})

    async def health(self, request: Request) -> Response:
        """``ok``, ``starting`` or ``unavailable``; the members' details only with the key."""
        status = self.state.status
        details: dict[str, Any] = {}
        if status == "ok":
            details = await self.backend.health()
            status = details["status"]
        body: dict[str, Any] = {"status": status}
        if self.authorized(request) and details:
            for member in details.get("members", []):  # the class of a member's error, never its text
                member["error"] = member["error"] and str(member["error"]).partition(":")[0]
            body.update(details, status=status)
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    async def metrics_route(self, request: Request) -> Response:
        metrics = self.metrics
        for member in (await self.backend.health()).get("members", []) if self.state.status == "ok" else []:
            metrics.queue_depth.labels(member=str(member["index"])).set(member["outstanding"])
            metrics.restarts.labels(member=str(member["index"])).set(member["restarts"])
        return Response(
            prometheus_client.generate_latest(metrics.registry), media_type=prometheus_client.CONTENT_TYPE_LATEST
        )

    async def voices_route(self, request: Request) -> Response:
        self.authorize(request)
        if request.method == "POST":
            return await self.voices.upload(request)
        if request.method == "DELETE":
            return await self.voices.delete(request)
        return await self.voices.list(request)

    async def run_backend(self, on_failure: Union[Callable[[BaseException], None], None]) -> None:
        try:
            await self.backend.start()
        except Exception as exc:
            log.error("the sidecars could not start: %s: %s", type(exc).__name__, exc)
            self.state.status = "unavailable"
            if on_failure is not None:
                on_failure(exc)
            return
        self.state.status = "ok"
        log.info("serving: engine %s is ready", self.backend.facts.name)


def _backend(engine: Union[str, None], pool: Union[Pool, None], ray: Any, pool_kwargs: dict[str, Any]) -> Backend:
    if ray is not None:
        if pool is not None or engine is not None or pool_kwargs:
            raise ValueError("give ray, or a pool, or the arguments to make one")
        return RayBackend(ray)
    if pool is None:
        pool = Pool(engine, **pool_kwargs)
    elif engine is not None or pool_kwargs:
        raise ValueError("give a pool or the arguments to make one, not both")
    return PoolBackend(pool)


def create_app(
    engine: Union[str, None] = None,
    *,
    pool: Union[Pool, None] = None,
    ray: Any = None,
    api_key: Union[str, None] = None,
    model: str = "indextts",
    voices: Union[Mapping[str, Union[str, None]], None] = None,
    voice_dir: Union[str, None] = None,
    voice_limits: Any = None,
    limits: Union[Limits, None] = None,
    websocket_limits: Union[WebSocketLimits, None] = None,
    on_start_failure: Union[Callable[[BaseException], None], None] = None,
    playground: bool = True,
    **pool_kwargs: Any,
) -> Starlette:
    """The ASGI app over ``pool`` (or a ``Pool(engine, **pool_kwargs)``), or over ``ray``, a
    :class:`indextts_client.ray.RayClient` (the ingress of a Ray Serve deployment).

    The app answers at once: ``/health`` says ``starting`` (503) while its lifespan starts
    the pool in the background, then ``ok``; ``on_start_failure(exc)`` hears of a pool that
    could not start (``serve`` exits non-zero on it).  ``voices`` maps request voice names to
    what the sidecar gets; ``voice_dir`` holds clips and uploads (:mod:`._voices`);
    ``voice_limits`` is a :class:`indextts_sidecar.voicestore.VoiceLimits`;
    ``websocket_limits`` bound ``/v1/audio/speech/stream`` (:mod:`._websocket`).  ``playground``
    serves the page of :mod:`._playground` at ``/``.
    """
    service = _Service(
        _backend(engine, pool, ray, pool_kwargs),
        api_key,
        model,
        Voices(voices, voice_dir, voice_limits),
        limits or Limits(),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.run_backend, on_start_failure)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                service.state.status = "unavailable"
                with anyio.CancelScope(shield=True):
                    await service.backend.aclose()

    speech = SpeechRoute(service.backend, service.metrics, service.prepare)
    routes = [
        Route("/v1/audio/speech", speech.__call__, methods=["POST"]),
        Route("/v1/audio/voices", service.voices_route, methods=["GET", "POST"]),
        Route("/v1/audio/voices/{voice_id}", service.voices_route, methods=["DELETE"]),
        Route("/v1/models", service.models, methods=["GET"]),
        Route("/health", service.health, methods=["GET"]),
        WebSocketRoute(
            "/v1/audio/speech/stream", SpeechSocket(service, websocket_limits or WebSocketLimits()).__call__
        ),
        Route("/metrics", service.metrics_route, methods=["GET"]),
    ]
    if playground:
        routes.append(Route("/", Playground().__call__, methods=["GET"]))
    middleware = [Middleware(LimitsMiddleware, limits=service.limits)]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=exception_handlers())
