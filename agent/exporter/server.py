"""The /metrics HTTP server: a small threading server around a page renderer.

It always answers in the Prometheus text format 0.0.4, whatever the Accept header asks:
Prometheus asks for OpenMetrics first, and dcgm-exporter's counter names (no `_total`) are not
valid OpenMetrics. / is a plain text index; anything else is 404.
"""

from __future__ import annotations

import gzip
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("gpufleet.agent.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsServerError(Exception):
    """The server cannot listen where it was asked to; the message names the address and why."""


def split_address(address: str) -> tuple[str, int]:
    """("0.0.0.0", 9400) from "0.0.0.0:9400"; "[::]:9400" gives ("::", 9400)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise MetricsServerError(f"metrics address must be HOST:PORT, not {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class MetricsServer:
    """Serves `render()` at /metrics on `address` (HOST:PORT; port 0 picks a free one).

    The constructor binds, so a port in use or a host that does not resolve fails at once with
    MetricsServerError, before the agent starts sampling. `start` serves in a daemon thread;
    `stop` closes the socket and waits for the thread.
    """

    def __init__(self, address: str, render: Callable[[], bytes], *, title: str = "gpufleet agent") -> None:
        host, port = split_address(address)
        handler = _handler(render, title)
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = server_class((host, port), handler)
        except OSError as exc:  # in use, not an address of this host, does not resolve
            raise MetricsServerError(f"cannot serve metrics on {address}: {exc.strerror or exc}") from exc
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """HOST:PORT actually bound (the real port when 0 was asked for)."""
        host, port = self._server.server_address[:2]
        host = str(host)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()


def _handler(render: Callable[[], bytes], title: str) -> type[BaseHTTPRequestHandler]:
    index = f"{title}\n\n/metrics  Prometheus metrics (text format 0.0.4)\n".encode()

    class Handler(BaseHTTPRequestHandler):
        timeout = 30  # a client that connects and says nothing does not hold a thread forever

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    page = render()
                except Exception as exc:  # a broken page is a 500 with its reason, not a dead server
                    log.exception("rendering /metrics failed")
                    self._send(
                        500, f"cannot render metrics: {exc}\n".encode(), "text/plain; charset=utf-8", body
                    )
                    return
                self._send(200, page, CONTENT_TYPE, body)
            elif path == "/":
                self._send(200, index, "text/plain; charset=utf-8", body)
            else:
                self._send(404, b"not found; see /metrics\n", "text/plain; charset=utf-8", body)

        def _send(self, status: int, payload: bytes, content_type: str, body: bool) -> None:
            gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
            if gzipped:
                payload = gzip.compress(payload, compresslevel=1)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            if body:
                self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
