"""The small HTTP server behind both /metrics endpoints (the agent's and the controller's), on asyncio.

It answers GET and HEAD, one request per connection (Prometheus reconnects each scrape): /metrics
with the page `render()` makes, an index at /, 404 elsewhere. Bounded whatever clients do:

- a listen backlog of BACKLOG, at most `max_connections` open connections (when full, the oldest
  one that has not yet sent its request is dropped for the newcomer, else the newcomer is);
- a connection costs a coroutine, not a thread: the TLS handshake, then the whole request head,
  must each arrive within `timeout` seconds (a silent or trickling client is cut off), and a client
  that stops reading the answer is cut off after `timeout` too;
- blocking work (bcrypt, and the agent's render) runs on a pool of WORKERS threads;
- a client that goes away mid-answer is a DEBUG line, never a traceback.

With a web-config (protos.webconfig.WebGuard) each connection gets the TLS context and basic-auth
users in force when it is accepted: 401 with `WWW-Authenticate: Basic` without valid credentials.
"""

from __future__ import annotations

import asyncio
import gzip as gzip_module
import logging
import socket
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from protos.webconfig import WebGuard

log = logging.getLogger("gpufleet.metrics.http")

REQUEST_TIMEOUT_SECONDS = 10.0
MAX_CONNECTIONS = 256
BACKLOG = 128
MAX_HEAD_BYTES = 16 * 1024
WORKERS = 2
TEXT = "text/plain; charset=utf-8"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def split_address(address: str) -> tuple[str, int]:
    """("0.0.0.0", 9400) from "0.0.0.0:9400"; "[::]:9400" gives ("::", 9400). ValueError if not HOST:PORT."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics address must be HOST:PORT, not {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def listen(address: str) -> socket.socket:
    """A non-blocking listening socket on HOST:PORT (port 0: one the OS picks), backlog BACKLOG.
    ValueError for a malformed address, OSError naming it when it cannot bind."""
    host, port = split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as exc:  # in use, not an address of this host, does not resolve
        raise OSError(f"cannot serve metrics on {address}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


def bound_address(sock: socket.socket) -> str:
    """HOST:PORT the socket is bound to, IPv6 hosts in brackets."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class ScrapeServer:
    """Serves `render` at /metrics on `sock` (from `listen`) until `stop`.

    `render_in_thread`: call it on the worker pool (the agent: its page may take a while) or on the
    event loop (the controller: a scrape then reads the app between two of its updates). On the
    loop, `render` may instead return a function that writes the page from what it read: that runs
    on the worker pool, so the loop only waits for the reading.
    """

    def __init__(
        self,
        sock: socket.socket,
        render: Callable[[], bytes | Callable[[], bytes]] | None,
        *,
        index: Reply,
        routes: Mapping[str, Callable[[], Reply]] | None = None,
        guard: WebGuard | None = None,
        render_in_thread: bool = False,
        gzip: bool = False,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
        content_type: str = "text/plain; version=0.0.4; charset=utf-8",
    ) -> None:
        self.sock = sock
        self.render = render  # None: no /metrics (a server of `routes` only)
        self.index = index
        self.routes = dict(routes or {})  # more paths, each answered by its function on the loop
        self.guard = guard
        self.render_in_thread = render_in_thread
        self.gzip = gzip
        self.timeout = timeout
        self.max_connections = max_connections
        self.content_type = content_type
        self.handlers: set[asyncio.Task[Any]] = set()
        self._waiting: dict[asyncio.Task[Any], None] = {}  # no request yet, oldest first
        self._sockets: dict[asyncio.Task[Any], socket.socket] = {}  # accepted, not yet a transport
        self._executor: ThreadPoolExecutor | None = None
        self._accepting: asyncio.Task[None] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.guard is not None and self.guard.tls else "http"

    def start(self) -> None:
        """Accept connections from now on (call on the loop that will serve them)."""
        self._accepting = asyncio.get_running_loop().create_task(self._accept_forever())

    async def stop(self) -> None:
        """Stop accepting, close the socket, cut open connections, wait for them."""
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
            self._accepting = None
        self.sock.close()
        for task in list(self.handlers):
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def _blocking(self, fn: Callable[[], Any]) -> Any:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="metrics-worker")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(self.sock)
            except OSError as exc:  # EMFILE and the like: wait rather than spin
                log.warning("metrics server cannot accept: %s", exc.strerror or exc)
                await asyncio.sleep(0.1)
                continue
            if len(self.handlers) >= self.max_connections:
                if not self._waiting:
                    log.debug("metrics: %d connections open, refusing %s", len(self.handlers), peer)
                    conn.close()
                    continue
                oldest = next(iter(self._waiting))
                self._waiting.pop(oldest)
                oldest.cancel()
                log.debug("metrics: %d connections open, dropped the oldest idle one", len(self.handlers))
            task = loop.create_task(self._connection(conn, peer))
            self.handlers.add(task)
            self._waiting[task] = None
            self._sockets[task] = conn
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.handlers.discard(task)
        self._waiting.pop(task, None)
        conn = self._sockets.pop(task, None)
        if conn is not None:  # cancelled before it began: the socket is still ours to close
            conn.close()

    async def _connection(self, conn: socket.socket, peer: Any) -> None:
        loop = asyncio.get_running_loop()
        where = peer[0] if isinstance(peer, tuple) else str(peer)
        state = self.guard.current() if self.guard is not None else None
        ssl_context = state.ssl_context if state is not None else None
        task = asyncio.current_task()
        assert task is not None
        reader = asyncio.StreamReader(limit=MAX_HEAD_BYTES, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            if ssl_context is not None:
                transport, _ = await loop.connect_accepted_socket(
                    lambda: protocol, conn, ssl=ssl_context, ssl_handshake_timeout=self.timeout
                )
            else:
                transport, _ = await loop.connect_accepted_socket(lambda: protocol, conn)
        except (OSError, asyncio.CancelledError) as exc:  # a failed handshake: wrong CA, plaintext, ...
            log.debug("metrics: connection from %s refused in the TLS handshake: %s", where, exc)
            return  # _done closes the socket
        self._sockets.pop(task, None)  # the transport's now
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        try:
            await self._serve_one(reader, writer, state.auth if state is not None else None)
        except TimeoutError:
            log.debug("metrics: %s stopped reading the answer; cut off", where)
            transport.abort()
        except OSError as exc:  # the scraper went away mid-answer (BrokenPipe, ConnectionReset)
            log.debug("metrics: scrape from %s ended early: %s", where, exc)
        except asyncio.CancelledError:
            transport.abort()  # the server is stopping, or a newcomer needed the slot
        finally:
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), self.timeout)
            except (TimeoutError, asyncio.CancelledError):
                # Closing waits for the client to read the rest: one that does not is cut off.
                transport.abort()
            except OSError:
                pass

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, auth: Any) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout)
        except (asyncio.IncompleteReadError, TimeoutError):
            return  # nothing sensible to answer
        except asyncio.LimitOverrunError:
            await self._respond(writer, "GET", Reply(400, TEXT, b"request head too large\n"))
            return
        task = asyncio.current_task()
        if task is not None:
            self._waiting.pop(task, None)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            await self._respond(writer, "GET", Reply(400, TEXT, b"malformed request line\n"))
            return
        method, target = parts[0], parts[1]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if auth is not None:
            credentials = headers.get("authorization")
            if not (auth.cached(credentials) or await self._blocking(lambda: auth.check(credentials))):
                challenge = (("WWW-Authenticate", 'Basic realm="gpufleet metrics"'),)
                await self._respond(writer, method, Reply(401, TEXT, b"unauthorized\n", challenge))
                return
        if method not in ("GET", "HEAD"):
            reply = Reply(405, TEXT, b"only GET and HEAD\n", (("Allow", "GET, HEAD"),))
            await self._respond(writer, method, reply)
            return
        try:
            path = urlsplit(target).path
        except ValueError:  # "http://[::1/metrics": not a URL urllib can split
            await self._respond(writer, method, Reply(400, TEXT, b"malformed request target\n"))
            return
        if path in self.routes:
            reply = self.routes[path]()
        elif path == "/metrics" and self.render is not None:
            reply = await self._page()
        elif path == "/":
            reply = self.index
        else:
            where = b"; metrics are at /metrics" if self.render is not None else b""
            reply = Reply(404, TEXT, b"not found" + where + b"\n")
        gzipped = self.gzip and "gzip" in headers.get("accept-encoding", "")
        await self._respond(writer, method, reply, gzipped=gzipped)

    async def _page(self) -> Reply:
        render = self.render
        if render is None:
            return Reply(404, TEXT, b"not found\n")
        try:
            page = await self._blocking(render) if self.render_in_thread else render()
            if callable(page):  # read on the loop, written on the pool
                page = await self._blocking(page)
        except Exception as exc:  # a broken page is a 500 with its reason, not a dead server
            log.exception("rendering /metrics failed")
            return Reply(500, TEXT, f"cannot render metrics: {exc}\n".encode())
        return Reply(200, self.content_type, page)

    async def _respond(
        self, writer: asyncio.StreamWriter, method: str, reply: Reply, *, gzipped: bool = False
    ) -> None:
        body = gzip_module.compress(reply.body, compresslevel=1) if gzipped else reply.body
        head = [
            f"HTTP/1.1 {reply.status} {_REASONS[reply.status]}",
            f"Content-Type: {reply.content_type}",
            f"Content-Length: {len(body)}",
            "Connection: close",
        ]
        if gzipped:
            head.append("Content-Encoding: gzip")
        head.extend(f"{name}: {value}" for name, value in reply.headers)
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD":
            writer.write(body)
        # A client that stops reading must not hold its connection (and the page) forever.
        await asyncio.wait_for(writer.drain(), self.timeout)
