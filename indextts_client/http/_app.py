"""The app: the service core (backend, voice sources, preparation) under HTTP's routes."""

from __future__ import annotations

import contextlib
import enum
import hmac
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Union

import anyio
import prometheus_client
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from indextts_sidecar.voicestore import VoiceLimits

from .._pool._pool import Pool
from .._service import Backend, Kind, PoolBackend, RayBackend, RayLike, Refusal, VoiceSources, prepare
from ._errors import exception_handlers
from ._limits import Limits, LimitsMiddleware
from ._metrics import Metrics
from ._origins import Origins, OriginsMiddleware
from ._playground import Playground
from ._schema import decode_speech
from ._speech import Job, SpeechRoute
from ._voices import VoiceRoutes
from ._websocket import SpeechSocket, WebSocketLimits

__all__ = ["create_app"]

log = logging.getLogger("indextts_client.http")


class Status(enum.Enum):
    STARTING = "starting"  # until the backend is up
    OK = "ok"
    UNAVAILABLE = "unavailable"  # it could not start, or it is closing


class Service:
    """What every route shares: the backend, the key, the voices, the bounds, the metrics."""

    def __init__(
        self, backend: Backend, api_key: Union[str, None], model: str, sources: VoiceSources, limits: Limits
    ) -> None:
        self.backend, self.api_key, self.model, self.sources, self.limits = backend, api_key, model, sources, limits
        self.status = Status.STARTING
        self.metrics = Metrics()
        self.voices = VoiceRoutes(sources, lambda: self.backend.facts)

    def key_ok(self, key: str) -> bool:
        return self.api_key is None or hmac.compare_digest(key.encode(), self.api_key.encode())

    def authorized(self, request: HTTPConnection) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.key_ok(token.strip())

    def authorize(self, request: HTTPConnection) -> None:
        if not self.authorized(request):
            raise Refusal(
                Kind.UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer KEY)", code="invalid_api_key"
            )

    def require_ready(self) -> None:
        if self.status is Status.STARTING:
            raise Refusal(Kind.STARTING, "the server is starting", code="starting")
        if self.status is not Status.OK:
            raise Refusal(Kind.UNAVAILABLE, "no sidecar could start", code="unavailable")

    async def prepare(self, request: Request) -> Job:
        self.authorize(request)
        self.require_ready()
        media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != "application/json":
            raise Refusal(Kind.UNSUPPORTED_MEDIA, "the body must be application/json", code="bad_content_type")
        speech = decode_speech(await request.body(), self.limits.max_input)
        prepared = await prepare(
            speech.settings(),
            self.backend.facts,
            self.sources,
            max_input=self.limits.max_input,
            max_silence=self.limits.max_silence,
        )
        return Job(speech, prepared)

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "indextts"}]})

    async def health(self, request: Request) -> Response:
        """``ok``, ``starting`` or ``unavailable``; the members' details only with the key."""
        status = self.status.value
        body: dict[str, object] = {}
        if self.status is Status.OK:
            report = await self.backend.health()
            status = "ok" if report.ok else "unavailable"
            if self.authorized(request):
                if report.members:
                    body["members"] = [dict(vars(member)) for member in report.members]
                if report.replica:
                    body["replica"] = dict(report.replica)
                if report.error:
                    body["error"] = report.error
        return JSONResponse({"status": status, **body}, status_code=200 if status == "ok" else 503)

    async def metrics_route(self, request: Request) -> Response:
        metrics = self.metrics
        if self.status is Status.OK:
            for member in (await self.backend.health()).members:
                metrics.queue_depth.labels(member=str(member.index)).set(member.outstanding)
                metrics.restarts.labels(member=str(member.index)).set(member.restarts)
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

    async def run_backend(
        self,
        on_failure: Union[Callable[[BaseException], None], None],
        on_ready: Union[Callable[[], None], None] = None,
    ) -> None:
        try:
            await self.backend.start()
        except Exception as exc:
            self.status = Status.UNAVAILABLE
            if on_failure is not None:
                on_failure(exc)  # serve says it, in one line, as it exits
            else:
                log.error("the sidecars could not start: %s: %s", type(exc).__name__, exc)
            return
        self.status = Status.OK
        log.info("serving: engine %s is ready", self.backend.facts.name)
        if on_ready is not None:
            on_ready()


def _backend(
    engine: Union[str, None], pool: Union[Pool, None], ray: Union[RayLike, None], pool_kwargs: dict[str, Any]
) -> Backend:
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
    ray: Union[RayLike, None] = None,
    api_key: Union[str, None] = None,
    model: str = "indextts",
    voices: Union[Mapping[str, Union[str, None]], None] = None,
    voice_dir: Union[str, None] = None,
    voice_limits: Union[VoiceLimits, None] = None,
    limits: Union[Limits, None] = None,
    websocket_limits: Union[WebSocketLimits, None] = None,
    cors_origins: Sequence[str] = (),
    allowed_hosts: Union[Sequence[str], None] = None,
    on_start_failure: Union[Callable[[BaseException], None], None] = None,
    on_ready: Union[Callable[[], None], None] = None,
    playground: bool = True,
    **pool_kwargs: Any,
) -> Starlette:
    """The ASGI app over ``pool`` (or a ``Pool(engine, **pool_kwargs)``), or over ``ray``, a
    :class:`indextts_client.ray.RayClient` (the ingress of a Ray Serve deployment).

    - ``api_key``: required as ``Authorization: Bearer KEY`` on ``/v1/*`` (None: open);
    - ``model``: the name ``/v1/models`` lists;
    - ``voices``: request voice names mapped to what the sidecar gets; ``voice_dir``: clips
      and uploads; ``voice_limits``: the store's bounds (:class:`indextts_sidecar.voicestore.VoiceLimits`);
    - ``limits``, ``websocket_limits``: the bounds of the routes (docs/reliability.md);
    - ``cors_origins``: the browser origins allowed besides the server's own (``*``: any);
      ``allowed_hosts``: with it, a keyless app answers only these ``Host`` names, IP addresses
      and localhost (:mod:`._origins`; ``serve`` always checks; None: not checked);
    - ``on_start_failure(exc)``: hears of a pool that could not start or load its engine (``serve``
      exits non-zero); ``on_ready()``: hears that it started and loaded (``/health`` says ``ok``
      from then on), both on the app's event loop;
    - ``playground``: serve the page of :mod:`._playground` at ``/``.

    The app answers at once: ``/health`` says ``starting`` (503) while its lifespan starts
    the pool (and loads the engine on every member) in the background, then ``ok``.
    """
    limits = limits or Limits()
    service = Service(
        _backend(engine, pool, ray, pool_kwargs), api_key, model, VoiceSources(voices, voice_dir, voice_limits), limits
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.run_backend, on_start_failure, on_ready)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                service.status = Status.UNAVAILABLE
                with anyio.CancelScope(shield=True):
                    await service.backend.aclose()

    speech = SpeechRoute(service.backend, service.metrics, service.prepare)
    origins = Origins(cors_origins, allowed_hosts, keyed=api_key is not None)
    socket = SpeechSocket(service, websocket_limits or WebSocketLimits(), origins)
    routes = [
        Route("/v1/audio/speech", speech.__call__, methods=["POST"]),
        Route("/v1/audio/voices", service.voices_route, methods=["GET", "POST"]),
        Route("/v1/audio/voices/{voice_id}", service.voices_route, methods=["DELETE"]),
        Route("/v1/models", service.models, methods=["GET"]),
        Route("/health", service.health, methods=["GET"]),
        WebSocketRoute("/v1/audio/speech/stream", socket.__call__),
        Route("/metrics", service.metrics_route, methods=["GET"]),
    ]
    if playground:
        routes.append(Route("/", Playground().__call__, methods=["GET"]))
    middleware = [
        Middleware(OriginsMiddleware, origins=origins),
        Middleware(LimitsMiddleware, limits=limits, authorized=service.authorized),
    ]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=exception_handlers())
