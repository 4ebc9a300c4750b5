"""The agent's /metrics HTTP server: protos.scrape_http on an event loop of its own, in one thread.

It always answers in the Prometheus text format 0.0.4, whatever the Accept header asks:
Prometheus asks for OpenMetrics first, and dcgm-exporter's counter names (no `_total`) are not
valid OpenMetrics. / is a plain text index; anything else is 404. Bounded: one event-loop thread
plus a pool of protos.scrape_http.WORKERS threads whatever the clients do (see that module), and an
aborted scrape is a DEBUG line. With a web-config file (Prometheus exporter-toolkit format, see
protos.webconfig) it speaks HTTPS and/or asks for basic auth.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from protos import scrape_http
from protos.webconfig import WebConfigError, WebGuard

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsServerError(Exception):
    """The server cannot start as asked (address, port, web-config); the message says why."""


def split_address(address: str) -> tuple[str, int]:
    """("0.0.0.0", 9400) from "0.0.0.0:9400"; "[::]:9400" gives ("::", 9400)."""
    try:
        return scrape_http.split_address(address)
    except ValueError as exc:
        raise MetricsServerError(str(exc)) from None


class MetricsServer:
    """Serves `render()` at /metrics on `address` (HOST:PORT; port 0 picks a free one).

    The constructor binds and loads `web_config`, so a port in use, a host that does not resolve or
    a bad web-config file fails at once with MetricsServerError, before the agent starts sampling.
    `timeout`: seconds a client has for the TLS handshake, for its request head, and to take the answer.
    `start` serves in a daemon thread; `stop` closes the socket and open connections and waits.
    """

    def __init__(
        self,
        address: str,
        render: Callable[[], bytes],
        *,
        title: str = "gpufleet agent",
        web_config: str | None = None,
        timeout: float = scrape_http.REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        split_address(address)
        try:
            guard = WebGuard(web_config) if web_config is not None else None
        except WebConfigError as exc:
            raise MetricsServerError(str(exc)) from None
        try:
            sock = scrape_http.listen(address)
        except OSError as exc:
            raise MetricsServerError(str(exc)) from None
        index = f"{title}\n\n/metrics  Prometheus metrics (text format 0.0.4)\n".encode()
        self._server = scrape_http.ScrapeServer(
            sock,
            render,
            index=scrape_http.Reply(200, scrape_http.TEXT, index),
            guard=guard,
            render_in_thread=True,
            gzip=True,
            timeout=timeout,
            content_type=CONTENT_TYPE,
        )
        self._address = scrape_http.bound_address(sock)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    @property
    def address(self) -> str:
        """HOST:PORT actually bound (the real port when 0 was asked for)."""
        return self._address

    @property
    def url(self) -> str:
        return f"{self._server.scheme}://{self.address}/metrics"

    def start(self) -> None:
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name="metrics-http", daemon=True)
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopping = asyncio.Event()
            self._server.start()
            started.set()
            await self._stopping.wait()
            await self._server.stop()

        try:
            asyncio.run(main())
        finally:
            started.set()  # start() never waits on a thread that died

    def stop(self) -> None:
        if self._thread is not None:
            assert self._loop is not None and self._stopping is not None
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join()
            self._thread = None
        self._server.sock.close()
