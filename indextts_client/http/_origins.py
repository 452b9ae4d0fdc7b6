"""Browsers: which ``Origin`` may change things or open the WebSocket, which ``Host`` is ours,
and CORS for the origins allowed (``serve --cors-origin``).

A web page on another site can make a browser send requests to a server on loopback or the
LAN: a form POST, a ``fetch`` with ``no-cors``, a WebSocket (which has no same-origin rule at
all).  So:

- a state-changing request (any method but GET, HEAD, OPTIONS) or a WebSocket handshake whose
  ``Origin`` is neither the server's own (the same host and port as ``Host``) nor allowed is
  refused (403 ``forbidden_origin``); a client that sends no ``Origin`` (not a browser) is not;
- without an API key, a request whose ``Host`` is not an IP address, ``localhost`` or an
  allowed name is refused (403 ``forbidden_host``): a DNS-rebinding page names its own host;
- an allowed origin gets CORS headers, and its preflight (``OPTIONS`` with
  ``Access-Control-Request-Method``) is answered 204; any other preflight gets 403.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Union
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._service import Kind, Refusal
from ._errors import HTTPError

__all__ = ["Origins", "OriginsMiddleware"]

_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_ALLOWED_METHODS = "GET, POST, DELETE, OPTIONS"
_ALLOWED_HEADERS = "authorization, content-type"
#: The response headers a page may read: the timing headers (docs/serving.md).
_EXPOSED = "x-queue-wait, x-time-to-first-audio, x-total-time, x-audio-seconds, x-real-time-factor"
_MAX_AGE = "600"


def _host_name(host: str) -> str:
    """``Host``'s name without its port, brackets removed from an IPv6 literal."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _is_local_name(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _normal(origin: str) -> str:
    """``scheme://host[:port]`` in lower case; a bare host is taken as any scheme's."""
    return origin.strip().rstrip("/").lower()


class Origins:
    """The policy: ``allowed`` origins (``*``: any); ``hosts``, the names besides IP addresses and
    localhost a keyless server answers (None: ``Host`` is not checked, for an app that another
    server fronts); ``keyed``: the server has a key (then any ``Host`` is fine: the key guards)."""

    def __init__(
        self, allowed: Iterable[str] = (), hosts: Union[Sequence[str], None] = None, keyed: bool = False
    ) -> None:
        self.allowed = frozenset(_normal(origin) for origin in allowed)
        self.any = "*" in self.allowed
        self.check_host = hosts is not None and not keyed
        self.hosts = frozenset(h.lower() for h in hosts or ()) | {urlsplit(o).hostname or "" for o in self.allowed}

    def allows(self, origin: str) -> bool:
        return self.any or _normal(origin) in self.allowed

    def refusal(self, scope: Scope) -> Union[Refusal, None]:
        """Why a request (HTTP or a WebSocket handshake) is refused here, or None."""
        headers = Headers(scope=scope)
        host = headers.get("host", "").lower()
        if self.check_host and host and not (_is_local_name(_host_name(host)) or _host_name(host) in self.hosts):
            return Refusal(Kind.FORBIDDEN, "this server does not answer to that Host name", code="forbidden_host")
        origin = headers.get("origin")
        changes = scope["type"] == "websocket" or scope.get("method", "GET") not in _SAFE
        if origin is None or not changes or self.allows(origin):
            return None
        same = urlsplit(origin)
        if origin != "null" and same.netloc.lower() == host:
            return None  # the server's own page (the playground)
        return Refusal(
            Kind.FORBIDDEN, "requests from this Origin are not allowed (serve --cors-origin)", code="forbidden_origin"
        )


class OriginsMiddleware:
    """Applies :class:`Origins` to HTTP requests (the WebSocket route checks its handshake itself)."""

    def __init__(self, app: ASGIApp, origins: Origins) -> None:
        self.app, self.origins = app, origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        preflight = scope["method"] == "OPTIONS" and "access-control-request-method" in headers
        refusal = self.origins.refusal(scope)
        if refusal is None and preflight and not (origin is not None and self.origins.allows(origin)):
            refusal = Refusal(
                Kind.FORBIDDEN, "this Origin is not allowed (serve --cors-origin)", code="forbidden_origin"
            )
        if refusal is not None:
            await HTTPError(refusal).response()(scope, receive, send)
            return
        if origin is None or not self.origins.allows(origin):
            await self.app(scope, receive, send)
            return
        cors = {
            "access-control-allow-origin": origin,
            "vary": "Origin",
            "access-control-expose-headers": _EXPOSED,
        }
        if preflight:
            cors.update(
                {
                    "access-control-allow-methods": _ALLOWED_METHODS,
                    "access-control-allow-headers": _ALLOWED_HEADERS,
                    "access-control-max-age": _MAX_AGE,
                }
            )
            await Response(status_code=204, headers=cors)(scope, receive, send)
            return

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [*message.get("headers", []), *((k.encode(), v.encode()) for k, v in cors.items())],
                }
            await send(message)

        await self.app(scope, receive, with_cors)
