"""The fake kube-apiserver: stdlib HTTP in a thread on 127.0.0.1, JSON only, every request recorded,
failures injected on demand; `add`, `get` and `objects` reach the same store from Python."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import socket
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from controller.kube.fake import routes, tables
from controller.kube.fake.errors import ApiError, page_not_found
from controller.kube.fake.resources import by_kind
from controller.kube.fake.rest import Api
from controller.kube.fake.store import Store

_PROBES = ("/healthz", "/livez", "/readyz")


class FakeApiServer:
    """A small kube-apiserver for tests and the demo: nodes, pods, evictions with PDBs, leases.

    `url` is http://127.0.0.1:PORT once started (the port is the kernel's pick). The namespaces
    default and kube-system exist from the start; adding a namespaced object creates its namespace.
    A deleted pod gets deletionTimestamp and goes `pod_grace_seconds` later (at once when that is 0
    or the request's grace period is 0), unless it is `stuck` or holds finalizers.
    """

    def __init__(self, *, pod_grace_seconds: float = 0.0) -> None:
        self.url = ""
        # (method, path?query) of every request, discovery included, in order
        self.requests: list[tuple[str, str]] = []
        # (namespace, pod): evicted or deleted, it never goes away (a finalizer that never clears)
        self.stuck: set[tuple[str, str]] = set()
        # (METHOD, regex searched in the path without its query) -> (HTTP status, times): answered
        # with that status (and a Status body) that many times, then served normally again
        self.fail: dict[tuple[str, str], tuple[int, int]] = {}
        self._store = Store()
        self._api = Api(self._store, self.stuck, pod_grace_seconds)
        self._lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        for namespace in ("default", "kube-system"):
            self.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    def start(self) -> FakeApiServer:
        if self._httpd is not None:
            return self
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        httpd.daemon_threads = True
        self._httpd = httpd
        self.url = f"http://127.0.0.1:{httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=httpd.serve_forever, args=(0.05,), name="fake-apiserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        with self._lock:
            for conn in list(self._connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create any supported kind (by apiVersion and kind); metadata is filled in; the stored copy."""
        with self._lock:
            try:
                return self._api.add(obj)
            except ApiError as e:
                raise ValueError(e.message) from e

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store `obj` (spec, status and all) over the object of its kind and name, as a controller
        or the kubelet would; the stored copy."""
        with self._lock:
            r = by_kind(obj["kind"], obj.get("apiVersion"))
            new = copy.deepcopy(obj)
            meta = new.setdefault("metadata", {})
            if r.namespaced:
                meta["namespace"] = meta.get("namespace") or "default"
            if self._store.get(r, meta.get("namespace", ""), meta["name"]) is None:
                raise KeyError(f"no {r.kind} {meta['name']!r}")
            return copy.deepcopy(self._store.update(r, new))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        r = by_kind(kind)
        with self._lock:
            self._reap()
            obj = self._store.get(r, (namespace or "default") if r.namespaced else "", name)
            return None if obj is None else self._api.get(r, obj["metadata"].get("namespace", ""), name)

    def objects(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        r = by_kind(kind)
        with self._lock:
            self._reap()
            return list(self._api.list(r, namespace if r.namespaced else None, {})["items"])

    def _reap(self) -> None:
        self._api.stuck = self.stuck  # the set may have been replaced, not only changed
        self._store.reap(self.stuck)

    def _injected(self, method: str, path: str) -> ApiError | None:
        for key, (code, times) in list(self.fail.items()):
            if key[0].upper() == method and re.search(key[1], path):
                if times <= 1:
                    del self.fail[key]
                else:
                    self.fail[key] = (code, times - 1)
                if times >= 1:
                    return ApiError(code, f"injected failure: {method} {path} answers {code}")
        return None

    def _serve(self, method: str, raw_path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, Any]:
        content_type = (headers.get("content-type") or "").split(";")[0].strip()
        with self._lock:
            self.requests.append((method, raw_path))
            path = urlsplit(raw_path).path.rstrip("/") or "/"
            try:
                failure = self._injected(method, path)
                if failure is not None:
                    raise failure
                self._reap()
                if path in _PROBES:
                    return 200, "ok"
                doc = routes.discover(path, headers.get("host") or "") if method == "GET" else None
                if doc is not None:
                    return 200, doc
                target = routes.parse(path)
                if target is None:
                    raise page_not_found()
                params = routes.query(urlsplit(raw_path).query)
                code, doc = routes.call(
                    self._api, method, target, params, content_type=content_type, body=routes.decode(body)
                )
                if method == "GET" and tables.wants_table(headers.get("accept") or ""):
                    doc = tables.of(target.resource.kind, doc, params.get("includeObject", ""))
                return code, doc
            except ApiError as e:
                return e.code, e.status()
            except Exception as e:  # noqa: BLE001 - a bug in the fake answers 500, as a server would
                return 500, ApiError(500, f"the fake API server failed: {e!r}").status()


def _handler(server: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 60
        # Headers and body go out as separate writes: without TCP_NODELAY the body waits for the
        # client's delayed ACK (about 40 ms a request).
        disable_nagle_algorithm = True

        def setup(self) -> None:
            super().setup()
            with server._lock:
                server._connections.add(self.connection)

        def finish(self) -> None:
            with server._lock:
                server._connections.discard(self.connection)
            super().finish()

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            code, doc = server._serve(
                self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
            )
            text = doc if isinstance(doc, str) else json.dumps(doc)
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(doc, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
