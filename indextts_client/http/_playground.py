"""``GET /``: the playground, one static page shipped in the package (``static/playground.html``).

The page is the same bytes for everyone and holds nothing of the server's: no key, no voice,
no engine fact.  So it is served without the API key (a browser cannot send a Bearer header
on a page load); the page asks for the key and sends it on each of its own requests, which
the API checks as it checks any client's.  Its headers lock it down: a Content-Security-Policy
that allows only its own inline script and style (by hash), requests to this origin only,
no framing, no referrer.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["Playground", "page"]

_BLOCK = re.compile(rb"<(script|style)>(.*?)</\1>", re.DOTALL)


def page() -> bytes:
    """The page's bytes, as shipped in the wheel."""
    return (resources.files(__package__) / "static" / "playground.html").read_bytes()


def _hashes(html: bytes, tag: bytes) -> str:
    return " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(body).digest()).decode()}'"
        for found_tag, body in _BLOCK.findall(html)
        if found_tag == tag
    )


class Playground:
    def __init__(self) -> None:
        self.html = page()
        policy = (
            "default-src 'none'; "
            f"script-src {_hashes(self.html, b'script')}; "
            f"style-src {_hashes(self.html, b'style')}; "
            "connect-src 'self'; media-src 'self' blob:; img-src 'self' data:; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        )
        self.headers = {
            "Content-Security-Policy": policy,
            "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        }

    async def __call__(self, request: Request) -> Response:
        return Response(self.html, media_type="text/html; charset=utf-8", headers=self.headers)
