"""`gpufleet controller` with TLS flags, as a process and as the overrides its flags make: the
operator port in the ready file, the plaintext warning, and one-line errors for unusable files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.cli.run_controller import _overrides
from controller.config import load
from controller.main import build_parser, main
from tests.controller.harness import frame, hello
from tests.security.tls_files import Pki, stream_one_frame

START_TIMEOUT_SECONDS = 20.0


def test_tls_flags_complete_the_files_tls_section_and_beat_plaintext(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(
        "listen: 0.0.0.0:50051\ntls:\n  client_ca: /etc/ca.pem\n  cert: old.pem\n  key: old.key\n"
    )
    argv = ["controller", "--config", str(path), "--tls-cert", "new.pem", "--tls-key", "new.key"]
    config = load(str(path), _overrides(build_parser().parse_args(argv)))
    assert (config.tls.cert, config.tls.key, config.tls.client_ca) == ("new.pem", "new.key", "/etc/ca.pem")
    assert not config.plaintext
    flags = ["controller", "--insecure", "--operator-listen", "0.0.0.0:50052", "--operator-tokens", "t.yaml"]
    insecure = load(
        str(path), _overrides(build_parser().parse_args([*flags, "--metrics-web-config", "w.yaml"]))
    )
    assert insecure.plaintext and insecure.insecure and insecure.tls.cert is None
    assert (insecure.operator_listen, insecure.operator_tokens, insecure.metrics_web_config) == (
        "0.0.0.0:50052",
        "t.yaml",
        "w.yaml",
    )


def test_gpufleet_controller_exits_2_in_one_line_on_an_unreadable_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = Pki(tmp_path)
    good = pki.server()
    missing = tmp_path / "gone.key"
    args = ["controller", "--listen", "10.0.0.1:0", "--db", ":memory:", "--metrics-address", "none"]
    tls = ["--tls-cert", good.cert, "--tls-key", str(missing), "--tls-client-ca", good.client_ca]
    assert main([*args, *tls]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpufleet controller: cannot read tls.key {missing}: No such file or directory"]
    # Plaintext off loopback needs --insecure; --insecure and TLS flags exclude each other.
    assert main(args) == 2
    assert "--insecure" in capsys.readouterr().err
    assert main([*args, *tls, "--insecure"]) == 2
    assert "exclude each other" in capsys.readouterr().err


@contextlib.contextmanager
def controller_process(tmp_path: Path, *flags: str) -> Iterator[dict[str, str]]:
    """`gpufleet controller` on 127.0.0.1 with `flags`, until the block ends (then SIGTERM, exit 0);
    yields its ready file."""
    ready = tmp_path / "ready"
    argv = [
        *(sys.executable, "-m", "controller", "controller", "--listen", "127.0.0.1:0"),
        *("--db", ":memory:", "--metrics-address", "none", "--ready-file", str(ready), *flags),
    ]
    with (tmp_path / "controller.log").open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=out, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not ready.exists():
            assert process.poll() is None, (tmp_path / "controller.log").read_text()
            assert time.monotonic() < deadline, "the controller did not start in time"
            time.sleep(0.05)
        yield json.loads(ready.read_text())
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_gpufleet_controller_with_tls_flags_and_an_operator_port(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    files = pki.server()
    tls = ("--tls-cert", files.cert, "--tls-key", files.key, "--tls-client-ca", files.client_ca)
    with controller_process(tmp_path, *tls, "--operator-listen", "127.0.0.1:0") as where:
        assert where["address"] != where["operator_address"]
        now = frame(1, t=time.time())  # a real process: the real clock
        answer = asyncio.run(stream_one_frame(where["address"], pki.client("n1"), hello("n1"), now))
        assert answer.ack.seq == 1
    text = (tmp_path / "controller.log").read_text()
    assert "mutual TLS" in text and f"operators on {where['operator_address']}" in text
    assert "plaintext gRPC" not in text and "Traceback" not in text, text


def test_a_plaintext_controller_warns_that_anyone_can_speak_as_any_node(tmp_path: Path) -> None:
    with controller_process(tmp_path) as where:
        assert "operator_address" not in where
        now = frame(1, t=time.time())
        assert asyncio.run(stream_one_frame(where["address"], None, hello("n1"), now)).ack.seq == 1
    warnings = [
        line for line in (tmp_path / "controller.log").read_text().splitlines() if " WARNING " in line
    ]
    assert any(
        f"plaintext gRPC: anyone who can reach {where['address']} can speak as any node" in line
        for line in warnings
    ), warnings
