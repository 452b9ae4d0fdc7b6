"""An OpenAI-compatible speech endpoint over a :class:`Pool` (extra ``[server]``).

::

    from indextts_client.http import create_app
    app = create_app("espeak", size=2, api_key="...")      # any ASGI server runs it

or from a shell: ``indextts-client serve --engine espeak --size 2`` (uvicorn).

Routes:

``POST /v1/audio/speech``
    OpenAI's body: ``model``, ``input``, ``voice``, ``response_format`` (``wav``, ``pcm``,
    ``flac`` where soundfile is installed), ``speed`` where the engine has a rate
    (espeak, IndexTTS-2.5), ``stream_format`` (``audio``: bytes as they are produced;
    ``sse``: ``speech.audio.delta`` / ``speech.audio.done`` events), and as an extension
    ``options``: the engine's request options (``temperature``...).  ``pcm`` is raw
    24 kHz signed 16-bit little-endian mono, as OpenAI defines it, whatever the engine's
    rate.  The first bytes leave after the first segment; a client that disconnects
    cancels its request on the sidecar.
``GET /v1/models``, ``GET /health`` (503 until a sidecar is ready), ``GET /metrics``.

With ``api_key``, every ``/v1/*`` route needs ``Authorization: Bearer KEY`` (401
otherwise).  Errors use OpenAI's error JSON: 400 invalid request, 401, 429 busy, 503 no
sidecar ready, 504 timeout.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import importlib
import io
import json
import struct
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol, Union

import anyio
import numpy as np

from indextts_sidecar.protocol.options import parse_options

from ._exceptions import (
    BusyError,
    ClosedError,
    CrashedError,
    InvalidRequestError,
    RequestTimeoutError,
    RestartLimitError,
    SidecarError,
    StartError,
)
from ._pool import Pool
from ._types import SidecarInfo

try:
    import prometheus_client
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        f"indextts_client.http needs the [server] extra: pip install 'indextts-sidecar[server]' ({exc})"
    ) from exc

__all__ = ["OPENAI_VOICES", "create_app"]

#: OpenAI's voice names; on an engine without voice cloning they mean its default voice.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse"}
)
#: The rate OpenAI's ``pcm`` format is defined at.
PCM_RATE = 24000
_FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str, *, param: Union[str, None] = None, code: str = "") -> None:
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code or kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


def _error_for(exc: BaseException) -> _HTTPError:
    if isinstance(exc, InvalidRequestError):
        field = str(exc.detail.get("field", "")) or None
        return _HTTPError(400, exc.message, "invalid_request_error", param=field, code=exc.code)
    if isinstance(exc, BusyError):
        return _HTTPError(429, exc.message, "rate_limit_error", code="busy")
    if isinstance(exc, RequestTimeoutError):
        return _HTTPError(504, str(exc), "timeout_error", code="timeout")
    if isinstance(exc, (StartError, RestartLimitError, ClosedError, CrashedError)):
        return _HTTPError(503, str(exc), "server_error", code="unavailable")
    message = exc.message if isinstance(exc, SidecarError) else str(exc)
    return _HTTPError(500, message, "server_error", code=getattr(exc, "code", "server_error"))


def _wav_header(rate: int, samples: Union[int, None]) -> bytes:
    """A 16-bit mono WAV header; ``samples=None`` (streaming) writes the maximum sizes."""
    data = 0xFFFFFFFF - 36 if samples is None else samples * 2
    return b"RIFF" + struct.pack(
        "<I4s4sIHHIIHH4sI", min(36 + data, 0xFFFFFFFF), b"WAVE", b"fmt ", 16, 1, 1, rate, rate * 2, 2, 16, b"data", data
    )


def _flac(samples: np.ndarray[Any, Any], rate: int) -> bytes:
    try:
        soundfile: Any = importlib.import_module("soundfile")
    except ImportError:
        raise _HTTPError(
            400,
            "response_format 'flac' needs soundfile on the server (pip install soundfile)",
            "invalid_request_error",
            param="response_format",
            code="unsupported_format",
        ) from None
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="FLAC", subtype="PCM_16")
    return out.getvalue()


class _Metrics:
    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.requests = prometheus_client.Counter(
            "indextts_requests", "Speech requests by outcome", ["outcome"], registry=self.registry
        )
        self.latency = prometheus_client.Histogram(
            "indextts_request_seconds", "Whole request time", registry=self.registry
        )
        self.first_audio = prometheus_client.Histogram(
            "indextts_first_audio_seconds", "Time to the first audio bytes", registry=self.registry
        )
        self.queue_depth = prometheus_client.Gauge(
            "indextts_queue_depth", "Requests in flight per member", ["member"], registry=self.registry
        )
        self.restarts = prometheus_client.Gauge(
            "indextts_restarts", "Sidecar restarts per member", ["member"], registry=self.registry
        )


def create_app(
    engine: Union[str, None] = None,
    *,
    pool: Union[Pool, None] = None,
    ray: Any = None,
    api_key: Union[str, None] = None,
    model: str = "indextts",
    voices: Union[Mapping[str, Union[str, None]], None] = None,
    **pool_kwargs: Any,
) -> Starlette:
    """The ASGI app over ``pool`` (or a ``Pool(engine, **pool_kwargs)``), which it starts and
    stops in its lifespan, or over ``ray``, a :class:`indextts_client.ray.RayClient` (the app
    is then the ingress of a Ray Serve deployment: see :func:`indextts_client.ray.http_ingress`).

    ``voices`` maps request voice names to what the sidecar gets (a reference clip path for
    IndexTTS, an espeak voice, None for the engine's default).
    """
    backend: _Backend
    if ray is not None:
        if pool is not None or engine is not None or pool_kwargs:
            raise ValueError("give ray, or a pool, or the arguments to make one")
        backend = _RayBackend(ray)
    else:
        if pool is None:
            pool = Pool(engine, **pool_kwargs)
        elif engine is not None or pool_kwargs:
            raise ValueError("give a pool or the arguments to make one, not both")
        backend = _PoolBackend(pool)
    metrics = _Metrics()
    voice_map = dict(voices or {})
    state: dict[str, Any] = {"ready": False, "error": None}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await backend.start()
            state["ready"] = True
        except Exception as exc:  # serve /health with the reason rather than die
            state["error"] = f"{type(exc).__name__}: {exc}"
        try:
            yield
        finally:
            state["ready"] = False
            await backend.aclose()

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise _HTTPError(
                401,
                "missing or wrong API key (Authorization: Bearer KEY)",
                "invalid_request_error",
                code="invalid_api_key",
            )

    async def speed_options(speed: float) -> dict[str, Any]:
        if speed == 1.0:
            return {}
        if not 0.25 <= speed <= 4.0:
            raise _HTTPError(400, "speed must be in [0.25, 4.0]", "invalid_request_error", param="speed")
        name, capabilities = await backend.engine()
        if name == "espeak":
            return {"rate": max(80, min(450, round(175 * speed)))}
        if name in ("indextts2.5", "indextts") and "duration" in capabilities:
            return {"duration_factor": 1.0 / speed}
        raise _HTTPError(400, f"engine {name!r} has no speed control", "invalid_request_error", param="speed")

    async def parse(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise _HTTPError(400, "the body is not JSON", "invalid_request_error") from None
        if not isinstance(body, dict):
            raise _HTTPError(400, "the body must be a JSON object", "invalid_request_error")
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise _HTTPError(400, "input must be a non-empty string", "invalid_request_error", param="input")
        fmt = body.get("response_format", "wav")
        if fmt not in _FORMATS:
            raise _HTTPError(
                400,
                f"response_format {fmt!r} is not supported here; use wav, pcm or flac",
                "invalid_request_error",
                param="response_format",
                code="unsupported_format",
            )
        stream_format = body.get("stream_format", "audio")
        if stream_format not in ("audio", "sse"):
            raise _HTTPError(400, "stream_format must be audio or sse", "invalid_request_error", param="stream_format")
        speed = body.get("speed", 1.0)
        if not isinstance(speed, (int, float)) or isinstance(speed, bool):
            raise _HTTPError(400, "speed must be a number", "invalid_request_error", param="speed")
        extra = body.get("options", {})
        if not isinstance(extra, dict):
            raise _HTTPError(400, "options must be an object", "invalid_request_error", param="options")
        voice = body.get("voice")
        if voice is not None and not isinstance(voice, str):
            raise _HTTPError(400, "voice must be a string", "invalid_request_error", param="voice")
        if voice in voice_map:
            voice = voice_map[voice]
        elif voice in OPENAI_VOICES and "voice_clone" not in (await backend.engine())[1]:
            voice = None
        return {
            "text": text,
            "voice": voice,
            "format": fmt,
            "stream_format": stream_format,
            "options": {**extra, **(await speed_options(float(speed)))},
        }

    async def speech(request: Request) -> Response:
        started = time.perf_counter()
        try:
            authorize(request)
            if not state["ready"]:
                raise _HTTPError(503, state["error"] or "no sidecar is ready yet", "server_error", code="unavailable")
            job = await parse(request)
        except _HTTPError as exc:
            metrics.requests.labels(outcome=str(exc.status)).inc()
            return exc.response()
        rate = PCM_RATE if job["format"] == "pcm" else None
        if job["format"] == "flac":
            return await whole_flac(job, started)
        stream = backend.stream(job["text"], voice=job["voice"], sample_rate=rate, **job["options"])
        try:
            chunks = await stream.__aenter__()
            first = await anext_or_none(chunks)
        except (SidecarError, anyio.get_cancelled_exc_class()) as exc:
            with anyio.CancelScope(shield=True):
                await stream.__aexit__(None, None, None)
            if not isinstance(exc, SidecarError):
                raise
            error = _error_for(exc)
            metrics.requests.labels(outcome=str(error.status)).inc()
            return error.response()
        metrics.first_audio.observe(time.perf_counter() - started)
        body = produce(stream, chunks, first, job, started)
        if job["stream_format"] == "sse":
            return StreamingResponse(body, media_type="text/event-stream")
        return StreamingResponse(body, media_type=_FORMATS[job["format"]])

    async def anext_or_none(stream: Any) -> Any:
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            return None

    async def produce(
        stream: Any, chunks: Any, first: Any, job: dict[str, Any], started: float
    ) -> AsyncIterator[bytes]:
        sse = job["stream_format"] == "sse"
        outcome = "200"
        try:
            chunk = first
            header_sent = job["format"] != "wav"
            while chunk is not None:
                data = chunk.samples.astype("<i2").tobytes()
                if not header_sent:
                    data = _wav_header(chunk.sample_rate, None) + data
                    header_sent = True
                if sse:
                    yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
                else:
                    yield data
                chunk = await anext_or_none(chunks)
            if sse:
                yield _sse({"type": "speech.audio.done", "usage": {"input_tokens": 0, "output_tokens": 0}})
        except SidecarError as exc:
            outcome = str(_error_for(exc).status)
            if sse:  # the status line is gone; an error event is what remains
                error = _error_for(exc)
                yield _sse({"type": "error", "error": {"message": str(error), "code": error.code}})
        except BaseException:
            outcome = "cancelled"  # the client went away: leaving the stream cancels on the sidecar
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await stream.__aexit__(None, None, None)
            metrics.requests.labels(outcome=outcome).inc()
            metrics.latency.observe(time.perf_counter() - started)

    async def whole_flac(job: dict[str, Any], started: float) -> Response:
        try:
            audio = await backend.synthesize(job["text"], voice=job["voice"], **job["options"])
            data = _flac(audio.samples, audio.sample_rate)
        except (SidecarError, _HTTPError) as exc:
            error = exc if isinstance(exc, _HTTPError) else _error_for(exc)
            metrics.requests.labels(outcome=str(error.status)).inc()
            return error.response()
        metrics.requests.labels(outcome="200").inc()
        metrics.latency.observe(time.perf_counter() - started)
        return Response(data, media_type=_FORMATS["flac"])

    async def models(request: Request) -> Response:
        try:
            authorize(request)
        except _HTTPError as exc:
            return exc.response()
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "indextts"}]})

    async def health(request: Request) -> Response:
        if not state["ready"]:
            return JSONResponse({"status": "starting", "error": state["error"]}, status_code=503)
        body = await backend.health()
        ready = body["status"] == "ok"
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_route(request: Request) -> Response:
        for member in (await backend.health()).get("members", []) if state["ready"] else []:
            metrics.queue_depth.labels(member=str(member["index"])).set(member["outstanding"])
            metrics.restarts.labels(member=str(member["index"])).set(member["restarts"])
        data = prometheus_client.generate_latest(metrics.registry)
        return Response(data, media_type=prometheus_client.CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/v1/audio/speech", speech, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics_route, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


class _Backend(Protocol):
    """What the app serves from: a local Pool, or a Ray Serve deployment through RayClient."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def engine(self) -> tuple[str, tuple[str, ...]]: ...

    def stream(self, text: str, **kwargs: Any) -> Any: ...

    async def synthesize(self, text: str, **kwargs: Any) -> Any: ...

    async def health(self) -> dict[str, Any]: ...


class _PoolBackend:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def start(self) -> None:
        await self.pool.start()

    async def aclose(self) -> None:
        await self.pool.aclose()

    async def engine(self) -> tuple[str, tuple[str, ...]]:
        for client in self.pool.members:
            with contextlib.suppress(RuntimeError):
                info: SidecarInfo = client.info
                return info.engine, info.capabilities
        return "", ()

    def stream(self, text: str, **kwargs: Any) -> Any:
        return self.pool.stream(text, **kwargs)

    async def synthesize(self, text: str, **kwargs: Any) -> Any:
        return await self.pool.synthesize(text, **kwargs)

    async def health(self) -> dict[str, Any]:
        members = await self.pool.health()
        return {
            "status": "ok" if any(m.state == "ready" for m in members) else "unavailable",
            "members": [
                {
                    "index": m.index,
                    "state": m.state,
                    "outstanding": m.outstanding,
                    "served": m.served,
                    "restarts": m.restarts,
                    "pid": m.pid,
                    "device": m.device,
                }
                for m in members
            ],
        }


class _RayBackend:
    """A Ray Serve deployment: Serve owns the replicas, so start and close are no-ops."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._engine: Union[tuple[str, tuple[str, ...]], None] = None

    async def start(self) -> None:
        await self.engine()

    async def aclose(self) -> None:
        pass

    async def engine(self) -> tuple[str, tuple[str, ...]]:
        if self._engine is None:
            info = await self.client.info()
            self._engine = (str(info["engine"]), tuple(info["capabilities"]))
        return self._engine

    def stream(self, text: str, **kwargs: Any) -> Any:
        return self.client.stream(text, **kwargs)

    async def synthesize(self, text: str, **kwargs: Any) -> Any:
        return await self.client.synthesize(text, **kwargs)

    async def health(self) -> dict[str, Any]:
        try:
            replica = await self.client.ping()
        except Exception as exc:
            return {"status": "unavailable", "error": f"{type(exc).__name__}: {exc}"}
        return {"status": "ok", "replica": replica}


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


def main(argv: Union[list[str], None] = None, prog: str = "python -m indextts_client.http") -> int:
    """``indextts-client serve`` / ``python -m indextts_client.http``: run the app under uvicorn."""
    import argparse
    import ipaddress
    import os

    import uvicorn

    parser = argparse.ArgumentParser(prog=prog, description="An OpenAI-compatible speech endpoint.")
    parser.add_argument("--engine", default="espeak")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--size", type=int, help="sidecars (default 1)")
    group.add_argument("--devices", help="one sidecar per device: cuda:0,cuda:1")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--fd", type=int, help="serve on this already bound listening socket instead")
    parser.add_argument("--api-key", help="require Authorization: Bearer KEY on /v1/* (default: $INDEXTTS_API_KEY)")
    parser.add_argument("--public", action="store_true", help="allow a non-loopback host without --api-key")
    parser.add_argument("--python", help="the engine venv's interpreter")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE", help="engine option")
    parser.add_argument("--voice", action="append", default=[], metavar="NAME=VALUE", help="map a voice name")
    parser.add_argument("--max-outstanding", type=int, default=4, help="requests in flight per sidecar")
    parser.add_argument("--pool-timeout", type=float, default=30.0, help="seconds a request waits for room")
    args = parser.parse_args(argv)
    api_key = args.api_key or os.environ.get("INDEXTTS_API_KEY")
    if args.fd is None and api_key is None and not args.public:
        try:
            loopback = ipaddress.ip_address(args.host).is_loopback
        except ValueError:
            loopback = args.host == "localhost"
        if not loopback:
            parser.error(f"--host {args.host} is not loopback: give --api-key, or --public to serve it open")

    try:
        engine_options = parse_options(args.option)
    except ValueError as exc:
        parser.error(str(exc))
    voices: dict[str, Union[str, None]] = {}
    for item in args.voice:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--voice {item!r} is not NAME=VALUE")
        voices[name] = value or None
    kwargs: dict[str, Any] = {
        "engine_options": engine_options,
        "max_outstanding": args.max_outstanding,
        "pool_timeout": args.pool_timeout,
    }
    if args.devices:
        kwargs["devices"] = [d for d in args.devices.split(",") if d]
    else:
        kwargs["size"] = args.size or 1
    if args.python:
        kwargs["python"] = args.python
    app = create_app(args.engine, api_key=api_key, voices=voices, **kwargs)
    if args.fd is not None:
        uvicorn.run(app, fd=args.fd, log_level="warning")
    else:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
