"""The controller's /metrics endpoint: a small HTTP server on the controller's own event loop.

On the loop rather than in a thread, so a scrape reads the app between two of its updates, never
during one. It answers GET and HEAD: /metrics in the Prometheus text format 0.0.4 whatever the
Accept header asks (Prometheus 2.42 asks for OpenMetrics first), a plain index at /, 404
elsewhere. One request per connection; Prometheus reconnects each scrape.
"""

from __future__ import annotations

import asyncio
import html
import logging
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger("gpufleet.controller.metrics")
REQUEST_TIMEOUT_SECONDS = 10.0
MAX_HEAD_BYTES = 16 * 1024
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
}
_TEXT = "text/plain; charset=utf-8"


def split_address(address: str) -> tuple[str, int]:
    """("host", port) from HOST:PORT; an IPv6 host may be written in brackets, [::1]:9401."""
    host, _, port = address.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


class MetricsServer:
    """`await start(address)` binds and serves; `await stop()` closes the listener and open connections."""

    def __init__(self, registry: CollectorRegistry, title: str = "gpufleet controller") -> None:
        self.registry = registry
        self.title = title
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    async def start(self, address: str) -> str:
        """Bind to HOST:PORT (port 0: one the OS picks); return the address bound. OSError if it cannot."""
        host, port = split_address(address)
        try:
            self._server = await asyncio.start_server(
                self._accept, host, port, limit=MAX_HEAD_BYTES, start_serving=True
            )
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {address}: {exc.strerror or exc}") from exc
        bound = self._server.sockets[0].getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        return f"{shown}:{bound}"

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve_one(reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the server is stopping
        except TimeoutError:
            writer.transport.abort()  # the client stopped reading: drop it and what it did not take
        finally:
            self._handlers.discard(task)
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), REQUEST_TIMEOUT_SECONDS)
            except (TimeoutError, asyncio.CancelledError):
                # Closing waits for the client to read the rest: one that does not is cut off.
                writer.transport.abort()
            except ConnectionError:
                pass

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_SECONDS)
        except (asyncio.IncompleteReadError, TimeoutError):
            return  # nothing sensible to answer
        except asyncio.LimitOverrunError:
            await _respond(writer, "GET", 400, _TEXT, b"request head too large\n")
            return
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            await _respond(writer, "GET", 400, _TEXT, b"malformed request line\n")
            return
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            await _respond(writer, method, 405, _TEXT, b"only GET and HEAD\n", allow="GET, HEAD")
            return
        try:
            path = urlsplit(target).path
        except ValueError:  # "http://[::1/metrics": not a URL urllib can split
            await _respond(writer, method, 400, _TEXT, b"malformed request target\n")
            return
        if path == "/metrics":
            try:
                body = generate_latest(self.registry)
            except Exception:  # a collector bug must not kill the server; say so and log why
                log.exception("rendering /metrics failed")
                await _respond(writer, method, 500, _TEXT, b"collecting metrics failed; see the log\n")
                return
            await _respond(writer, method, 200, CONTENT_TYPE_PLAIN_0_0_4, body)
        elif path == "/":
            await _respond(writer, method, 200, "text/html; charset=utf-8", self._index())
        else:
            await _respond(writer, method, 404, _TEXT, b"not found; metrics are at /metrics\n")

    def _index(self) -> bytes:
        title = html.escape(self.title)
        return (
            f"<!doctype html>\n<html><head><title>{title}</title></head>\n"
            f'<body><h1>{title}</h1><p><a href="/metrics">/metrics</a></p></body></html>\n'
        ).encode()


async def _respond(
    writer: asyncio.StreamWriter, method: str, status: int, content_type: str, body: bytes, *, allow: str = ""
) -> None:
    head = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if allow:
        head.append(f"Allow: {allow}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
    if method != "HEAD":
        writer.write(body)
    # A client that stops reading must not hold its connection (and the page) forever.
    await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_SECONDS)
