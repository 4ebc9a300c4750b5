"""tests/support.py free_port: a port the system offers again is not handed out twice."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tests import support


def test_a_port_offered_again_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    offered = iter([47001, 47001, 47002])  # the system offers the first port twice

    class Offering:
        def __enter__(self) -> Offering:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def bind(self, address: Any) -> None:
            self.port = next(offered)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(support, "_GIVEN", set())
    monkeypatch.setattr(socket, "socket", Offering)  # the module tests.support binds with
    assert [support.free_port(), support.free_port()] == [47001, 47002]


def test_real_ports_are_distinct_and_bindable() -> None:
    ports = [support.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    with socket.create_server(("127.0.0.1", ports[-1])):
        pass
