"""A Hugging Face hub on loopback, for the set-up tests: the endpoints huggingface_hub's downloads call.

What huggingface_hub (checked against its source) asks of a hub:

* ``GET /api/models/{repo}`` (or ``.../revision/{rev}``): the model's info (``sha`` is the commit);
* ``GET /api/models/{repo}/tree/{rev}?recursive=...``: the files, with ``size`` and ``oid``;
* ``HEAD /{repo}/resolve/{rev}/{path}``: ``ETag``, ``X-Repo-Commit``, ``Content-Length``;
* ``GET`` of the same URL, with ``Range: bytes=N-`` when it resumes a partial file.

Errors carry ``X-Error-Code`` as the hub's do (``RepoNotFound``, ``GatedRepo``), which is
what huggingface_hub turns into its typed errors.  A file can be made to stall half-way
(``stall``) so that a test can interrupt a download at a known point, without sleeping.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Union
from urllib.parse import unquote, urlparse

#: How long a stalled response waits to be released before it gives up (a bound, not a delay).
STALL_LIMIT = 60.0


@dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False
    sha: str = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Stall:
    """Send ``after`` bytes of ``path``, then hold the response until ``release`` is set."""

    repo: str
    path: str
    after: int
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


class Hub:
    def __init__(self, repos: dict[str, Repo], token: str = "hf_test_token") -> None:
        self.repos = repos
        self.token = token
        #: (method, path, Range header or None) of every request, in order.
        self.requests: list[tuple[str, str, Union[str, None]]] = []
        self.stall: Union[Stall, None] = None
        #: When set, every file request answers this status (a hub in trouble).
        self.fail_with: Union[int, None] = None
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @contextmanager
    def running(self) -> Iterator[Hub]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            if self.stall is not None:
                self.stall.release.set()
            self.server.shutdown()
            self.server.server_close()
            thread.join(10)

    def requested(self, path_suffix: str) -> list[tuple[str, str, Union[str, None]]]:
        with self._lock:
            return [r for r in self.requests if r[1].endswith(path_suffix)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _error(self, status: int, code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, data: object) -> None:
                body = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _repo(self, repo_id: str) -> Union[Repo, None]:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(404, "RepoNotFound", "Repository not found")
                return repo

            def _authorized(self) -> bool:
                return self.headers.get("Authorization") == f"Bearer {hub.token}"

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                path = unquote(urlparse(self.path).path)
                with hub._lock:
                    hub.requests.append((self.command, path, self.headers.get("Range")))
                api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(/.*)?)?", path)
                if api:
                    repo = self._repo(api.group(1))
                    if repo is None:
                        return
                    if api.group(2) in (None, "revision"):
                        siblings = [{"rfilename": name} for name in repo.files]
                        self._json({"id": api.group(1), "sha": repo.sha, "siblings": siblings, "gated": repo.gated})
                        return
                    self._json(
                        [
                            {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                            for name, data in repo.files.items()
                        ]
                    )
                    return
                resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if not resolve:
                    self._error(404, "EntryNotFound", "not found")
                    return
                repo = self._repo(resolve.group(1))
                if repo is None:
                    return
                if hub.fail_with is not None:
                    self._error(hub.fail_with, "", "Internal Error")
                    return
                if repo.gated and not self._authorized():
                    self._error(401, "GatedRepo", "Access to this model is restricted")
                    return
                name = resolve.group(3)
                data = repo.files.get(name)
                if data is None:
                    self._error(404, "EntryNotFound", "Entry not found")
                    return
                self._send_file(resolve.group(1), name, data, repo.sha)

            def _send_file(self, repo_id: str, name: str, data: bytes, sha: str) -> None:
                start = 0
                wanted = self.headers.get("Range")
                match = re.fullmatch(r"bytes=(\d+)-", wanted or "")
                if match and self.command == "GET":
                    start = int(match.group(1))
                self.send_response(206 if start else 200)
                self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", sha)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if self.command == "HEAD":
                    return
                stall = hub.stall
                if stall is not None and (stall.repo, stall.path) == (repo_id, name) and not start:
                    self.wfile.write(data[: stall.after])
                    self.wfile.flush()
                    stall.reached.set()
                    stall.release.wait(STALL_LIMIT)
                    self.close_connection = True
                    return
                self.wfile.write(data[start:])

        return Handler


def standin_repos(gpt_size: int = 4 << 20) -> dict[str, Repo]:
    """IndexTTS-2's repository and the four auxiliary ones, with stand-in content (no torch here).

    ``gpt.pth`` is ``gpt_size`` bytes of a fixed pattern (big enough to be cut half-way);
    w2v-bert-2.0 also holds a large file setup must not fetch (upstream reads only three).
    """
    pattern = hashlib.sha256(b"gpt").digest()
    files = {
        "config.yaml": b"version: 2.0\n",
        "bpe.model": b"stand-in bpe",
        "gpt.pth": (pattern * (gpt_size // len(pattern) + 1))[:gpt_size],
        "s2mel.pth": b"stand-in s2mel",
        "wav2vec2bert_stats.pt": b"stand-in stats",
        "feat1.pt": b"stand-in feat1",
        "feat2.pt": b"stand-in feat2",
        "qwen0.6bemo4-merge/config.json": b"{}",
    }
    return {
        "IndexTeam/IndexTTS-2": Repo(files),
        "IndexTeam/IndexTTS-2.5": Repo(
            {
                "config.yaml": b"version: 2.5\n",
                "gpt.pth": b"g",
                "codec.pth": b"c",
                "s2mel.pth": b"s",
                "wav2vec2bert_stats.pt": b"w",
                "feat1.pt": b"1",
                "feat2.pt": b"2",
                "multilingual_zh_ja_yue_char_del.tiktoken": b"t",
            }
        ),
        "facebook/w2v-bert-2.0": Repo(
            {
                "config.json": b"{}",
                "preprocessor_config.json": b"{}",
                "model.safetensors": b"stand-in w2v",
                "conformer_shaw.pt": b"not wanted" * 1000,
            }
        ),
        "amphion/MaskGCT": Repo(
            {"semantic_codec/model.safetensors": b"stand-in codec", "acoustic_codec/model.safetensors": b"no"}
        ),
        "funasr/campplus": Repo({"campplus_cn_common.bin": b"stand-in campplus"}),
        "nvidia/bigvgan_v2_22khz_80band_256x": Repo(
            {
                "config.json": b"{}",
                "bigvgan_generator.pt": b"stand-in bigvgan",
                "bigvgan_discriminator_optimizer.pt": b"no",
            }
        ),
    }
