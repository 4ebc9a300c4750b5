"""The agent's side of mutual TLS, against a real TLS controller on 127.0.0.1: it streams with its
files, reconnects when they change, waits out missing files with its frames kept, and says clearly
why a plaintext stream to a TLS controller gets nowhere."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.cli import _overrides, build_parser
from agent.cli import main as agent_main
from agent.compose.stream import client_tls
from agent.config import StreamConfig, load
from agent.daemon import Agent
from agent.sources.sim import SimNode
from agent.sources.sim.host import SimHost
from agent.sources.sim.probes import ModelledProbes
from agent.stream.backoff import Backoff
from agent.stream.client import StreamClient
from agent.stream.spool import Spool
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.transport import ClientTls
from tests.controller.harness import frame, hello
from tests.security.tls_files import Pki, controller_config, tls_controller

LOG = "tests.security.agent"
TIMEOUT = 10.0


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def running(run: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> AsyncIterator[None]:
    """Run `run(stop)` as a task; on exit set stop and require it to end promptly and cleanly."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT)


async def refuse(command: pb.Command) -> pb.CommandResult:
    raise AssertionError(f"unexpected command {command}")


def client(target: str, spool: Spool, tls: ClientTls | None) -> StreamClient:
    made = StreamClient(
        target,
        spool,
        lambda: hello("n1"),
        refuse,
        backoff=Backoff(0.01, 0.05),
        log=logging.getLogger(LOG),
        tls=tls,
    )
    made.rotation_check_seconds = 0.05
    return made


def spooled(*seqs: int) -> Spool:
    spool = Spool(None)
    for seq in seqs:
        spool.append(frame(seq))
    return spool


def messages(caplog: pytest.LogCaptureFixture, text: str, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


def install(source: str, target: str) -> None:
    shutil.copyfile(source, f"{target}.new")
    os.replace(f"{target}.new", target)


def test_streams_with_its_files_and_reconnects_when_they_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = Pki(tmp_path)
    issued = pki.client("n1", stem="first")
    live = ClientTls(pki.ca_file, str(tmp_path / "node.crt"), str(tmp_path / "node.key"))
    install(issued.cert or "", live.cert or "")
    install(issued.key or "", live.key or "")
    spool = spooled(1)

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server())) as ctl:
            agent = client(ctl.address, spool, live)
            async with running(agent.run):
                await until(lambda: len(spool) == 0, "frame 1 acked")
                assert ctl.app.identity.transports == {"n1": "mtls"}
                renewed = pki.client("n1", stem="renewed")  # the old files are gone after this
                install(renewed.key or "", live.key or "")
                install(renewed.cert or "", live.cert or "")
                await until(
                    lambda: bool(messages(caplog, "TLS files changed", logging.INFO)), "the reconnect"
                )
                spool.append(frame(2))
                agent.notify()
                await until(
                    lambda: len(spool) == 0 and agent.connected, "frame 2 acked on the new connection"
                )
            assert ctl.app.ingest.counters.frames == 2

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
    assert len(messages(caplog, "TLS files changed", logging.INFO)) == 1
    connected = [r for r in caplog.records if r.getMessage().startswith("agent connected: node n1")]
    assert len(connected) == 2
    assert not messages(caplog, "retry")  # a rotation is no failure: no warning, no backoff


def test_missing_files_are_retried_with_the_frames_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = Pki(tmp_path)
    issued = pki.client("n1")
    later = ClientTls(pki.ca_file, str(tmp_path / "later.crt"), str(tmp_path / "later.key"))
    spool = spooled(1, 2)

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server())) as ctl:
            agent = client(ctl.address, spool, later)
            async with running(agent.run):
                await until(lambda: len(messages(caplog, "cannot read certificate")) >= 2, "two failed tries")
                assert len(spool) == 2 and not agent.connected
                install(issued.key or "", later.key or "")
                install(issued.cert or "", later.cert or "")
                await until(lambda: len(spool) == 0, "both frames acked once the files are there")

    with caplog.at_level(logging.WARNING, logger=LOG):
        asyncio.run(scenario())
    first = messages(caplog, "cannot read certificate")[0]
    assert f"TLS: cannot read certificate {later.cert}: No such file or directory" in first
    assert "(2 frames spooled)" in first


def test_plaintext_to_a_tls_controller_says_what_to_do_and_stops_promptly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = Pki(tmp_path)
    spool = spooled(1)

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server())) as ctl:
            agent = client(ctl.address, spool, None)
            async with running(agent.run):
                await until(lambda: len(messages(caplog, "retry")) >= 3, "three refused tries")
            assert len(spool) == 1 and ctl.app.ingest.counters.frames == 0

    with caplog.at_level(logging.WARNING, logger=LOG):
        asyncio.run(scenario())
    assert (
        "if the controller requires TLS, give --tls-ca, --tls-cert and --tls-key"
        in messages(caplog, "retry")[0]
    )


def test_plaintext_is_said_once_at_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.stream"):
        assert client_tls(StreamConfig(controller="127.0.0.1:50051")) is None
        assert client_tls(StreamConfig()) is None  # not streaming: nothing to say
        tls = client_tls(
            StreamConfig(controller="ctl.example:1", tls_ca="ca.pem", tls_cert="n.pem", tls_key="n.key")
        )
    assert tls == ClientTls("ca.pem", "n.pem", "n.key")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(
        "plaintext stream to controller 127.0.0.1:50051: not encrypted"
    )


def test_the_agent_daemon_streams_over_tls_from_its_config(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    tls = pki.client("n1")

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server()), clock=time.time) as ctl:
            stream = {"controller": ctl.address, "tls_ca": tls.ca, "tls_cert": tls.cert, "tls_key": tls.key}
            config = load(None, {"node": "n1", "source": "sim", "interval_seconds": 0.05, "stream": stream})
            sim = SimNode("n1", gpus=1)
            agent = Agent(config, sim, SimHost(sim), ModelledProbes(sim))
            async with running(agent.run):
                await until(lambda: ctl.app.ingest.counters.frames >= 2, "two frames over mutual TLS")
            assert ctl.app.identity.transports == {"n1": "mtls"}

    asyncio.run(scenario())


def test_agent_flags_set_the_stream_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--controller", "10.0.0.1:9", "--tls-ca", "ca.pem", "--tls-cert", "n.pem", "--tls-key", "n.key"]
    stream = load(None, _overrides(build_parser().parse_args(argv))).stream
    assert (stream.tls_ca, stream.tls_cert, stream.tls_key, stream.insecure) == (
        "ca.pem",
        "n.pem",
        "n.key",
        False,
    )
    insecure = load(None, _overrides(build_parser().parse_args(["--controller", "10.0.0.1:9", "--insecure"])))
    assert insecure.stream.insecure and insecure.stream.tls_ca is None
    assert agent_main(["--sim", "--controller", "10.0.0.1:9", "--once"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a loopback address" in err[0] and "--insecure" in err[0]


def test_an_agent_with_another_nodes_certificate_hears_permission_denied_every_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Frames wait for the controller to accept the Hello, so a refusal reaches the agent as the
    controller said it, never as the INTERNAL of a write that raced it."""
    pki = Pki(tmp_path)
    spool = spooled(1, 2, 3)  # frames ready to go at once: the race this guards against

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server())) as ctl:
            agent = client(ctl.address, spool, pki.client("n2"))  # says n1 (hello("n1")), holds n2's
            async with running(agent.run):
                await until(lambda: len(messages(caplog, "retry")) >= 8, "eight refused attempts")
            assert ctl.app.identity.refusals["other_node"] >= 8
            assert ctl.app.ingest.counters.frames == 0

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
    retries = messages(caplog, "retry")
    assert all("PERMISSION_DENIED: certificate is for node(s) n2" in m for m in retries), retries
    assert len(spool) == 3  # nothing acked, nothing lost
