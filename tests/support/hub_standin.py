"""A local stand-in for the Hugging Face Hub: the endpoints ``huggingface_hub`` 2.x calls to list and download a
model repository, served from memory over real HTTP (``HF_ENDPOINT`` points at it).

What it answers, as the Hub does:

* ``GET /api/models/ORG/NAME`` and ``.../revision/REV``: the repository's commit (``sha``) and files;
* ``GET /api/models/ORG/NAME/tree/REV[/PATH]``: the file listing (LFS files with their sha256 and size);
* ``HEAD``/``GET /ORG/NAME/resolve/REV/PATH``: the file, with ``X-Repo-Commit``, ``ETag`` (the git blob id, or for
  LFS files the sha256, also as ``X-Linked-Etag`` with ``X-Linked-Size``), ``Content-Length`` and ``Range``
  requests (206, for resumed downloads);
* 404 with ``X-Error-Code`` ``RepoNotFound`` / ``EntryNotFound`` / ``RevisionNotFound``.

The tests count the requests (``requests``), cut a transfer halfway (``cut_once``: the next GET of that file
sends its full ``Content-Length`` and closes after half the bytes) and advertise a wrong sha256 (``bad_sha``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes (what the Hub sends as the ETag of a small, non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """One model repository at one commit: its files' bytes by path."""

    def __init__(self, repo_id: str, files: dict[str, bytes]) -> None:
        self.repo_id = repo_id
        self.files = files
        digest = hashlib.sha1(repo_id.encode())
        for path in sorted(files):
            digest.update(path.encode() + git_blob_id(files[path]).encode())
        self.sha = digest.hexdigest()

    def entry(self, path: str, bad_sha: bool) -> dict:
        data = self.files[path]
        entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
        if path.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data + (b"tampered" if bad_sha else b"")).hexdigest()
            entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
        return entry


class HubStandIn:
    """Start with ``with HubStandIn() as hub:``; ``hub.url`` is the ``HF_ENDPOINT``."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[str] = []
        self.cut_once: set[str] = set()
        self.bad_sha: set[str] = set()
        self.ranges: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}"

    def add(self, repo_id: str, files: dict[str, bytes | Path]) -> Repo:
        repo = Repo(repo_id, {name: data if isinstance(data, bytes) else Path(data).read_bytes()
                              for name, data in files.items()})
        self.repos[repo_id] = repo
        return repo

    def __enter__(self) -> "HubStandIn":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # the tests read hub.requests instead
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        return Handler

    # ------------------------------------------------------------------ routing
    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        with self._lock:
            ranged = f" Range={h.headers['Range']}" if h.headers.get("Range") else ""
            self.requests.append(f"{h.command} {path}{ranged}")
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(?:/(.*))?)?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if api:
            self._api(h, api.group(1), api.group(2), api.group(3) or "main", api.group(4) or "")
        elif resolve:
            self._resolve(h, resolve.group(1), resolve.group(2), resolve.group(3), body)
        else:
            self._error(h, "RepoNotFound")

    def _repo(self, h, repo_id: str, revision: str) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, "RepoNotFound")
        elif revision not in ("main", repo.sha):
            self._error(h, "RevisionNotFound", repo)
            repo = None
        return repo

    def _api(self, h, repo_id: str, kind: str | None, revision: str, sub: str) -> None:
        repo = self._repo(h, repo_id, revision)
        if repo is None:
            return
        if kind == "tree":
            listing = [repo.entry(p, p in self.bad_sha) for p in sorted(repo.files) if p.startswith(sub)]
            self._json(h, listing, repo)
        else:
            self._json(h, {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False,
                           "siblings": [{"rfilename": p} for p in sorted(repo.files)]}, repo)

    def _resolve(self, h, repo_id: str, revision: str, name: str, body: bool) -> None:
        repo = self._repo(h, repo_id, revision)
        if repo is None:
            return
        if name not in repo.files:
            self._error(h, "EntryNotFound", repo)
            return
        data = repo.files[name]
        entry = repo.entry(name, name in self.bad_sha)
        start = 0
        ranged = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range", ""))
        if ranged and body:
            start = int(ranged.group(1))
            self.ranges.append(f"{name}:{start}")
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", repo.sha)
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Type", "application/octet-stream")
        if "lfs" in entry:
            h.send_header("ETag", f'"{entry["oid"]}"')
            h.send_header("X-Linked-Etag", f'"{entry["lfs"]["oid"]}"')
            h.send_header("X-Linked-Size", str(len(data)))
        else:
            h.send_header("ETag", f'"{entry["oid"]}"')
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(data) - start))
        cut = body and not start and name in self.cut_once
        if cut:
            self.cut_once.discard(name)
            h.send_header("Connection", "close")
        h.end_headers()
        if not body:
            return
        if cut:
            h.wfile.write(data[:len(data) // 2])
            h.wfile.flush()
            h.close_connection = True
            return
        h.wfile.write(data[start:])

    def _json(self, h, payload, repo: Repo) -> None:
        raw = json.dumps(payload).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("X-Repo-Commit", repo.sha)
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(raw)

    def _error(self, h, code: str, repo: Repo | None = None) -> None:
        raw = json.dumps({"error": code}).encode()
        h.send_response(404)
        h.send_header("X-Error-Code", code)
        h.send_header("Content-Type", "application/json")
        if repo is not None:
            h.send_header("X-Repo-Commit", repo.sha)
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(raw)

    def network_requests(self) -> int:
        with self._lock:
            return len(self.requests)
