"""Socket addresses as both ends write them: ``tcp://HOST:PORT`` and ``unix:///PATH``."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = ["Address", "is_loopback", "parse_url"]


@dataclass(frozen=True)
class Address:
    """``tcp://HOST:PORT`` or ``unix:///PATH``."""

    scheme: str
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


def parse_url(url: str) -> Address:
    """Parse a listen or connect address; ValueError with a readable message when it is not one."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        path = unquote(parts.netloc + parts.path)
        if not path:
            raise ValueError(f"{url!r}: a unix address needs a path, as in unix:///run/tts.sock")
        return Address("unix", path=path)
    if parts.scheme == "tcp":
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None or parts.path not in ("", "/"):
            raise ValueError(f"{url!r}: a tcp address is tcp://HOST:PORT")
        return Address("tcp", host=parts.hostname, port=port)
    raise ValueError(f"{url!r}: the address must start with tcp:// or unix://")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
