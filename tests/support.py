"""Test helpers shared across the suite: CI strictness for optional peers, and free loopback ports."""

from __future__ import annotations

import os
import socket

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def require(condition: bool, reason: str) -> None:
    """Skip with `reason` locally; fail under CI=true, where every peer must be installed."""
    if not condition:
        if IN_CI:
            pytest.fail(f"required in CI: {reason}")
        pytest.skip(reason)


_GIVEN: set[int] = set()  # ports free_port handed out in this process


def free_port() -> int:
    """A loopback port free now, never one this process was given before: a port picked for a
    server that starts later is not held, and the system may offer it again (a standby's metrics
    port came back as the Service stand-in's, and the standby, unable to serve, exited)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
