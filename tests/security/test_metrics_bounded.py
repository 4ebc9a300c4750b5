"""Issue 15 case 9: the /metrics servers stay bounded whatever clients do, and an aborted scrape is
a DEBUG line, never a traceback."""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from controller import metrics_http
from protos import scrape_http
from tests.security.metrics_servers import KINDS, PAGE, Running, agent_server, get, serve


@contextlib.contextmanager
def silent_clients(running: Running, count: int) -> Iterator[list[socket.socket]]:
    """`count` connections that never send a byte."""
    clients = []
    try:
        for _ in range(count):
            clients.append(socket.create_connection((running.host, running.port), timeout=20))
        yield clients
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize("kind", KINDS)
def test_fifty_silent_clients_do_not_stop_a_scrape_and_threads_stay_bounded(kind: str) -> None:
    with serve(kind) as running:
        assert get(running).status == 200
        before = threading.active_count()
        with silent_clients(running, 50):
            answer = get(running)
            assert answer.status == 200 and b"up 1" in answer.body
            # One worker pool, whatever the number of connections (the old agent had a thread each).
            assert threading.active_count() <= before + scrape_http.WORKERS


def test_when_connections_are_full_the_oldest_idle_one_makes_room(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_http, "MAX_CONNECTIONS", 10)
    with serve("controller") as running, silent_clients(running, 30) as clients:
        assert get(running).status == 200
        # The first ones were dropped for the newcomers: the server closed them.
        clients[0].settimeout(20)
        assert clients[0].recv(1) == b""


def test_a_trickling_client_is_cut_off() -> None:
    """A client that sends its request head a byte at a time, forever, loses its connection."""
    with agent_server(timeout=0.5) as running:
        with socket.create_connection((running.host, running.port), timeout=20) as client:
            client.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: ")
            deadline = time.monotonic() + 20
            cut = False
            while not cut and time.monotonic() < deadline:
                readable, _, _ = select.select([client], [], [], 0.1)
                try:
                    cut = bool(readable) and client.recv(1) == b""
                    client.sendall(b"a")
                except ConnectionError:
                    cut = True
            assert cut, "the server kept a trickling client for 20 s"
        assert get(running).status == 200


def test_an_aborted_scrape_is_a_debug_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    big = PAGE + b"# " + b"x" * (32 * 1024 * 1024) + b"\n"
    caplog.set_level(logging.DEBUG)
    with agent_server(render=lambda: big) as running:
        for _ in range(3):
            client = socket.create_connection((running.host, running.port), timeout=20)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(1024).split(b"\r\n", 1)[0].endswith(b" 200 OK")
            # Gone mid-answer, with a reset (SO_LINGER 0): the server's next write fails.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not _ended_early(caplog):
            time.sleep(0.05)
        assert get(running).status == 200
    assert _ended_early(caplog)
    assert all(record.exc_info is None for record in caplog.records)
    assert all(record.levelno < logging.WARNING for record in caplog.records), [
        record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING
    ]
    assert "Traceback" not in capfd.readouterr().err


def _ended_early(caplog: pytest.LogCaptureFixture) -> bool:
    return any(
        record.levelno == logging.DEBUG and "ended early" in record.getMessage() for record in caplog.records
    )
