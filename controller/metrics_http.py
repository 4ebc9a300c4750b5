"""The controller's /metrics endpoint: protos.scrape_http on the controller's own event loop.

The families are read on the loop rather than in a thread, so a scrape reads the app between two
of its updates, never during one; the page is written from them on a worker thread. It answers
GET and HEAD: /metrics in the Prometheus text format 0.0.4 whatever the Accept header asks
(Prometheus 2.42 asks for OpenMetrics first), an HTML index at /, 404 elsewhere. One request per
connection; Prometheus reconnects each scrape. Bounded (connections, timeouts, threads) as
protos.scrape_http says; with a web-config file (Prometheus exporter-toolkit format, see
protos.webconfig) it speaks HTTPS and/or asks for basic auth.
"""

from __future__ import annotations

import asyncio
import html
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import CollectorRegistry

from controller.metrics_text import collected
from protos import scrape_http
from protos.webconfig import WebConfigError, WebGuard

REQUEST_TIMEOUT_SECONDS = scrape_http.REQUEST_TIMEOUT_SECONDS
MAX_CONNECTIONS = scrape_http.MAX_CONNECTIONS


def split_address(address: str) -> tuple[str, int]:
    """("host", port) from HOST:PORT; an IPv6 host may be written in brackets, [::1]:9401."""
    return scrape_http.split_address(address)


class MetricsServer:
    """`await start(address)` binds and serves; `await stop()` closes the listener and open connections.

    `web_config`: a Prometheus web-config file (TLS, basic auth); start() raises OSError naming it
    when it cannot be used, before anything is bound.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        title: str = "gpufleet controller",
        *,
        web_config: str | None = None,
    ) -> None:
        self.registry = registry
        self.title = title
        self.web_config = web_config
        self._server: scrape_http.ScrapeServer | None = None

    @property
    def _handlers(self) -> set[asyncio.Task[Any]]:
        return self._server.handlers if self._server is not None else set()

    @property
    def scheme(self) -> str:
        return self._server.scheme if self._server is not None else "http"

    async def start(self, address: str) -> str:
        """Bind to HOST:PORT (port 0: one the OS picks); return the address bound. OSError if it cannot."""
        try:
            guard = WebGuard(self.web_config) if self.web_config is not None else None
        except WebConfigError as exc:
            raise OSError(f"cannot serve metrics: {exc}") from None
        try:
            sock = scrape_http.listen(address)
        except ValueError as exc:
            raise OSError(f"cannot serve metrics on {address}: {exc}") from None
        self._server = scrape_http.ScrapeServer(
            sock,
            lambda: collected(self.registry),
            index=scrape_http.Reply(200, "text/html; charset=utf-8", self._index()),
            guard=guard,
            timeout=REQUEST_TIMEOUT_SECONDS,
            max_connections=MAX_CONNECTIONS,
            content_type=CONTENT_TYPE_PLAIN_0_0_4,
        )
        self._server.start()
        host = split_address(address)[0]
        port = scrape_http.split_address(scrape_http.bound_address(sock))[1]
        shown = f"[{host}]" if ":" in host else host
        return f"{shown}:{port}"

    async def stop(self) -> None:
        if self._server is None:
            return
        await self._server.stop()
        self._server = None

    def _index(self) -> bytes:
        title = html.escape(self.title)
        return (
            f"<!doctype html>\n<html><head><title>{title}</title></head>\n"
            f'<body><h1>{title}</h1><p><a href="/metrics">/metrics</a></p></body></html>\n'
        ).encode()
