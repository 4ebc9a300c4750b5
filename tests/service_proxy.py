"""A stand-in for a Kubernetes Service in front of controller replicas, for end-to-end tests: a TCP
listener on a free loopback port that joins each connection to the first backend that accepts it
(in the order given), so that when a replica dies its agents' next connections reach the others.

    with ServiceProxy(["127.0.0.1:5001", "127.0.0.1:5002"]) as service:
        agent connects to service.address
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

from tests.support import free_port


class ServiceProxy:
    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self._stopping = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._accepting = threading.Thread(target=self._accept, name="service-proxy", daemon=True)

    def __enter__(self) -> ServiceProxy:
        self._accepting.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stopping.set()
        self._accepting.join(timeout=5)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _backend(self) -> socket.socket | None:
        for backend in self.backends:
            host, _, port = backend.rpartition(":")
            try:
                return socket.create_connection((host, int(port)), timeout=2)
            except OSError:
                continue
        return None

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = self._backend()
            if upstream is None:  # no replica up: the client's connection is refused, as a Service's
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes one way until either side ends; then end both."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
