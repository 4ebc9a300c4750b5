"""Both /metrics servers (the agent's and the controller's) started for real on 127.0.0.1, a small
blocking HTTP(S) client for them, and web-config files with throwaway certificates (trustme)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import trustme
from prometheus_client import CollectorRegistry, Gauge

from agent.exporter import MetricsServer as AgentMetricsServer
from controller.metrics_http import MetricsServer as ControllerMetricsServer

PAGE = b"# TYPE up gauge\nup 1\n"
KINDS = ["agent", "controller"]


@dataclass
class Running:
    host: str
    port: int
    scheme: str


@contextlib.contextmanager
def agent_server(
    web_config: str | None = None, render: Callable[[], bytes] = lambda: PAGE, timeout: float = 10.0
) -> Iterator[Running]:
    server = AgentMetricsServer("127.0.0.1:0", render, web_config=web_config, timeout=timeout)
    server.start()
    try:
        host, port = server.address.rsplit(":", 1)
        yield Running(host, int(port), server.url.split(":", 1)[0])
    finally:
        server.stop()


@contextlib.contextmanager
def controller_server(web_config: str | None = None) -> Iterator[Running]:
    """The controller's server on an event loop of its own in a thread (the test's client blocks)."""
    registry = CollectorRegistry(auto_describe=False)
    Gauge("up", "whether the test server is up", registry=registry).set(1)
    server = ControllerMetricsServer(registry, web_config=web_config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        address = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1:0"), loop).result(30)
        host, port = address.rsplit(":", 1)
        yield Running(host, int(port), server.scheme)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@contextlib.contextmanager
def serve(kind: str, web_config: str | None = None) -> Iterator[Running]:
    with agent_server(web_config) if kind == "agent" else controller_server(web_config) as running:
        yield running


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def get(
    running: Running,
    path: str = "/metrics",
    *,
    auth: tuple[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> Answer:
    """One GET; HTTPS with `context` (which trusts the server's CA, and may carry a client cert)."""
    conn: http.client.HTTPConnection
    if context is not None:
        conn = http.client.HTTPSConnection(running.host, running.port, timeout=20, context=context)
    else:
        conn = http.client.HTTPConnection(running.host, running.port, timeout=20)
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return Answer(response.status, dict(response.headers), response.read())
    finally:
        conn.close()


def bcrypt_hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


@dataclass
class Pki:
    """A server CA and certificate for 127.0.0.1, and a CA for scrapers with one client certificate."""

    dir: Path
    server_ca: trustme.CA
    client_ca: trustme.CA
    client: trustme.LeafCert

    @classmethod
    def make(cls, where: Path) -> Pki:
        server_ca, client_ca = trustme.CA(), trustme.CA()
        pki = cls(where, server_ca, client_ca, client_ca.issue_cert("prometheus"))
        pki.issue_server(server_ca)
        client_ca.cert_pem.write_to_path(str(where / "client-ca.pem"))
        return pki

    def issue_server(self, ca: trustme.CA) -> None:
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        leaf.cert_chain_pems[0].write_to_path(str(self.dir / "server.pem"))
        leaf.private_key_pem.write_to_path(str(self.dir / "server.key"))

    def tls_block(self, client_auth: str | None = None) -> str:
        text = "tls_server_config:\n"
        text += f"  cert_file: {self.dir / 'server.pem'}\n  key_file: {self.dir / 'server.key'}\n"
        if client_auth:
            text += f"  client_auth_type: {client_auth}\n  client_ca_file: {self.dir / 'client-ca.pem'}\n"
        return text

    def client_context(
        self, *, ca: trustme.CA | None = None, cert: trustme.LeafCert | None = None
    ) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        (ca or self.server_ca).configure_trust(ctx)
        if cert is not None:
            cert.configure_cert(ctx)
        return ctx
