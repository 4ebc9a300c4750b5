"""A deadline for a whole HTTP request, not only for each socket read.

requests' read timeout bounds each socket read: a BMC that sends one byte every second never trips
it, and one GET can then last forever. Here every request gets a watchdog: at the deadline it shuts
down the request's socket, which ends the blocked read at once, and marks the request as expired so
the caller reports a timeout whatever exception (or truncated answer) the cut produced.

How the socket is found: the session's requests.Session gets an adapter whose connection pools make
`WatchedHTTP(S)Connection`s; these attach their socket to the calling thread's current `Watch` when
they connect and whenever they send a request on a kept-alive connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import requests
import requests.adapters
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

_CURRENT = threading.local()


class Watch:
    """One request's deadline. `expired` tells, after the request, whether the deadline cut it."""

    def __init__(self) -> None:
        self.expired = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._timer: threading.Timer | None = None

    def start(self, seconds: float) -> Watch:
        _CURRENT.watch = self
        if seconds <= 0:
            self.cut()
        else:
            self._timer = threading.Timer(seconds, self.cut)
            self._timer.daemon = True
            self._timer.start()
        return self

    def done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._sock = None
        if getattr(_CURRENT, "watch", None) is self:
            _CURRENT.watch = None

    def attach(self, sock: socket.socket | None) -> None:
        """The socket the request runs on; if the deadline already passed, it is cut now."""
        with self._lock:
            self._sock = sock
            if self.expired:
                _shutdown(sock)
                raise TimeoutError("request deadline passed")

    def cut(self) -> None:
        """The deadline: mark expired and shut the socket down (a blocked read returns at once)."""
        with self._lock:
            self.expired = True
            _shutdown(self._sock)


def _shutdown(sock: socket.socket | None) -> None:
    if sock is None:
        return
    with contextlib.suppress(OSError):  # already closed or never connected
        sock.shutdown(socket.SHUT_RDWR)


def _current() -> Watch | None:
    watch: Watch | None = getattr(_CURRENT, "watch", None)
    return watch


class WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        watch = _current()
        if watch is not None:
            watch.attach(sock)  # the TLS socket wraps this one: shutting it down ends both
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        watch = _current()
        if watch is not None and self.sock is not None:
            watch.attach(self.sock)  # a kept-alive connection: _new_conn is not called again
        super().request(*args, **kwargs)


class WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        watch = _current()
        if watch is not None:
            watch.attach(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        watch = _current()
        if watch is not None and self.sock is not None:
            watch.attach(self.sock)
        super().request(*args, **kwargs)


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = WatchedHTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = WatchedHTTPSConnection


class WatchedAdapter(requests.adapters.HTTPAdapter):
    """An HTTPAdapter whose connections honour the calling thread's `Watch`."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}


def watch_session(session: requests.Session) -> None:
    """Make every request of `session` honour the calling thread's `Watch`."""
    adapter = WatchedAdapter(max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
