"""ProbeNode and the probe scheduler over real gRPC on 127.0.0.1.

A scripted agent (a raw Telemetry stream the test drives) pins down the controller's side: the
command it sends, when a waiting operator is answered, which results come back. A simulated agent
(the real agent daemon over a SimNode) checks the whole path, scheduler included.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import pytest
from prometheus_client import generate_latest

from agent.config import load
from agent.daemon import Agent
from agent.sources.sim import SimNode
from agent.sources.sim.host import SimHost
from agent.sources.sim.probes import ModelledProbes
from controller.config import ProbeConfig
from controller.errors import FailedPrecondition
from controller.metrics import controller_registry
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc, telemetry_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import Running, as_frame, as_hello, config, hello, running_controller

if TYPE_CHECKING:  # the async stubs exist only in the generated type stubs
    OperatorStub: TypeAlias = operator_pb2_grpc.OperatorAsyncStub

AgentCall = grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControllerMessage]
OFFERED = ["gemm", "membw", "pcie", "nccl"]
TIMEOUT = 10.0


async def until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def controller(
    probes: dict[str, Any] | None = None, **overrides: Any
) -> AsyncIterator[tuple[Running, OperatorStub]]:
    """A controller on the real clock; no probes on connect unless asked for."""
    cfg = config(probes=ProbeConfig(**{"on_connect": False, **(probes or {})}), **overrides)
    async with (
        running_controller(cfg, clock=time.time) as running,
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        yield running, operator_pb2_grpc.OperatorStub(channel)


@contextlib.asynccontextmanager
async def scripted_agent(
    running: Running, node: str = "n1", gpus: int = 2, offered: list[str] | None = None
) -> AsyncIterator[AgentCall]:
    """A connected stream that has said hello; the test writes and reads on it."""
    async with grpc.aio.insecure_channel(running.address) as channel:
        call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(None)
        probes = OFFERED if offered is None else offered
        capabilities = ["run_probes"] if probes else []
        await call.write(as_hello(hello(node, gpus=gpus, capabilities=capabilities, probes=probes)))
        await until(
            lambda: running.app.fleet.nodes.get(node) is not None and running.app.fleet.nodes[node].connected,
            "hello",
        )
        try:
            yield call
        finally:
            call.cancel()


async def next_command(call: AgentCall) -> pb.Command:
    while True:
        msg = await asyncio.wait_for(call.read(), TIMEOUT)
        assert isinstance(msg, pb.ControllerMessage), msg
        if msg.WhichOneof("msg") == "command":
            return msg.command


def results_frame(seq: int, node: str, results: list[pb.ProbeResult]) -> pb.AgentMessage:
    f = pb.TelemetryFrame(node=node, boot_id="b1", seq=seq)
    f.time.FromNanoseconds(time.time_ns())
    f.probes.extend(results)
    return as_frame(f)


def gemm(gpu: int, command_id: str, value: float = 700.0, error: str = "") -> pb.ProbeResult:
    r = pb.ProbeResult(
        probe="gemm", variant="bf16", gpu=gpu, value=value, unit="TFLOP/s", command_id=command_id
    )
    r.time.FromNanoseconds(time.time_ns())
    if error:
        r.error = error
    return r


async def status_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


def test_probe_node_refuses_what_it_cannot_do_with_a_clear_status() -> None:
    async def go() -> None:
        async with controller() as (running, stub):
            await running.app.ingest.hello(
                hello("quiet", gpus=2, capabilities=["run_probes"], probes=OFFERED)
            )
            req = operator_pb2.ProbeNodeRequest
            assert await status_of(stub.ProbeNode(req(node="ghost"))) == (
                grpc.StatusCode.NOT_FOUND,
                "node 'ghost' is not known to this controller",
            )
            assert await status_of(stub.ProbeNode(req(node="quiet"))) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "node quiet is not connected",
            )
            async with scripted_agent(running, "plain", offered=[]):
                code, details = await status_of(stub.ProbeNode(req(node="plain")))
                assert code == grpc.StatusCode.FAILED_PRECONDITION and "cannot run probes" in details
            async with scripted_agent(running, "n1") as call:
                code, details = await status_of(stub.ProbeNode(req(node="n1", gpus=[0, 5])))
                assert (code, details) == (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "node n1 has no GPU 5 (it has: 0, 1)",
                )
                code, details = await status_of(stub.ProbeNode(req(node="n1", probes=["warp"])))
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "does not offer probe warp" in details
                code, _ = await status_of(stub.ProbeNode(req(node="n1", timeout_seconds=-1)))
                assert code == grpc.StatusCode.INVALID_ARGUMENT
                first = await stub.ProbeNode(req(node="n1"))  # no wait: sent, not done
                assert first.command_id and not first.done
                code, details = await status_of(stub.ProbeNode(req(node="n1")))
                assert code == grpc.StatusCode.FAILED_PRECONDITION
                assert details == f"node n1 is already probing (command {first.command_id}, operator)"
                assert (await next_command(call)).id == first.command_id

    asyncio.run(go())


@pytest.mark.parametrize("results_first", [False, True], ids=["answer-then-results", "results-then-answer"])
def test_a_waiting_operator_gets_the_answer_and_the_results_of_its_command(results_first: bool) -> None:
    async def go() -> None:
        async with controller() as (running, stub), scripted_agent(running) as call:
            request = operator_pb2.ProbeNodeRequest(
                node="n1", probes=["gemm"], gpus=[1], force=True, wait=True
            )
            pending = asyncio.ensure_future(stub.ProbeNode(request))
            command = await next_command(call)
            assert command.run_probes == pb.RunProbes(probes=["gemm"], gpus=[1], force=True)
            mine = gemm(1, command.id)
            stale = gemm(0, "an-older-command", value=650.0)
            answer = pb.AgentMessage(command_result=pb.CommandResult(command_id=command.id, ok=True))
            frame = results_frame(1, "n1", [mine, stale])
            for msg in (frame, answer) if results_first else (answer, frame):
                await call.write(msg)
                await asyncio.sleep(0.05)  # in this order on the controller's side
            resp = await asyncio.wait_for(pending, TIMEOUT)
            assert (resp.command_id, resp.done, resp.ok, resp.error) == (command.id, True, True, "")
            assert list(resp.results) == [mine]
            # Both results were stored for detection, whichever command they answer.
            assert {key[1] for key in running.app.fleet.probes} == {0, 1}

    asyncio.run(go())


def test_a_failed_run_comes_back_with_its_error_and_failed_results() -> None:
    async def go() -> None:
        async with controller() as (running, stub), scripted_agent(running) as call:
            pending = asyncio.ensure_future(
                stub.ProbeNode(operator_pb2.ProbeNodeRequest(node="n1", wait=True))
            )
            command = await next_command(call)
            assert command.run_probes == pb.RunProbes()  # every GPU, the agent's suite, no force
            failed = gemm(0, command.id, value=0.0, error="GPU 0 busy: 1 foreign compute process")
            await call.write(results_frame(1, "n1", [failed, gemm(1, command.id)]))
            error = "gemm/bf16: GPU 0 busy: 1 foreign compute process"
            await call.write(
                pb.AgentMessage(command_result=pb.CommandResult(command_id=command.id, error=error))
            )
            resp = await asyncio.wait_for(pending, TIMEOUT)
            assert (resp.done, resp.ok, resp.error) == (True, False, error)
            assert [r.gpu for r in resp.results] == [0, 1] and resp.results[0].error
            assert running.app.probing.commands.failed[("operator", "error")] == 1
            assert running.app.probing.commands.in_flight == {}

    asyncio.run(go())


def test_no_answer_within_the_timeout_is_done_false_and_the_node_stays_busy() -> None:
    async def go() -> None:
        async with controller() as (running, stub), scripted_agent(running) as call:
            request = operator_pb2.ProbeNodeRequest(node="n1", wait=True, timeout_seconds=0.3)
            started = time.monotonic()
            resp = await stub.ProbeNode(request)
            assert 0.3 <= time.monotonic() - started < 10.0
            assert (resp.done, resp.ok, list(resp.results)) == (False, False, [])
            assert (await next_command(call)).id == resp.command_id
            # The agent may still be probing: the node counts as busy until the command's timeout.
            code, _ = await status_of(stub.ProbeNode(operator_pb2.ProbeNodeRequest(node="n1")))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            record = running.app.commands.get(resp.command_id)
            assert record is not None and record.state == "sent"
            record.deadline = time.time()  # as if the probe timeout had passed
            await running.app.probing.schedule_pass()
            assert record.state == "timed_out"
            assert running.app.probing.commands.failed[("operator", "timeout")] == 1
            page = generate_latest(controller_registry(running.app)).decode()
            assert 'gpufleet_controller_probe_commands_total{reason="operator"} 1.0' in page
            assert (
                'gpufleet_controller_probe_command_failures_total{failure="timeout",reason="operator"} 1.0'
                in page
            )
            assert "gpufleet_controller_probes_in_flight 0.0" in page

    asyncio.run(go())


def test_a_recovery_probe_runs_the_default_suite_and_is_counted_as_recovery() -> None:
    """kube/recovery.py's re-probe of a drained node whose findings cleared: the configured suite on
    every GPU, stored as the recovery's, and refused like any probe while one is in flight."""

    async def go() -> None:
        async with (
            controller(probes={"suite": "full"}) as (running, _),
            scripted_agent(running) as call,
        ):
            sent = await running.app.probing.recovery_probe("n1")
            command = await next_command(call)
            assert command.id == sent.id
            assert (command.run_probes.suite, list(command.run_probes.gpus)) == ("full", [])
            record = running.app.commands.get(sent.id)
            assert record is not None and record.requester == "recovery"
            with pytest.raises(FailedPrecondition, match="already probing"):
                await running.app.probing.recovery_probe("n1")
            page = generate_latest(controller_registry(running.app)).decode()
            assert 'gpufleet_controller_probe_commands_total{reason="recovery"} 1.0' in page

    asyncio.run(go())


# With the real agent daemon over a simulated node


def sim_agent(tmp_path: Path, address: str, node: str, **sim: Any) -> Agent:
    cfg = load(
        None,
        {
            "node": node,
            "source": "sim",
            "interval_seconds": 0.1,
            "sim": {"gpus": 2},
            "stream": {"controller": address, "backoff_initial_seconds": 0.05, "backoff_max_seconds": 0.2},
            "metrics": {"address": None},
        },
    )
    source = SimNode(node, gpus=2, **sim)
    return Agent(cfg, source, SimHost(source), ModelledProbes(source))


@contextlib.asynccontextmanager
async def agents_running(*agents: Agent) -> AsyncIterator[None]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop)) for a in agents]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT)


def test_a_simulated_agent_answers_probe_node_with_its_modelled_results(tmp_path: Path) -> None:
    async def go() -> None:
        async with controller() as (running, stub):
            agent = sim_agent(tmp_path, running.address, "sim-1")
            async with agents_running(agent):
                await until(
                    lambda: "sim-1" in running.app.fleet.nodes and running.app.fleet.nodes["sim-1"].connected,
                    "the agent",
                )
                request = operator_pb2.ProbeNodeRequest(
                    node="sim-1", probes=["gemm", "pcie"], gpus=[1], wait=True
                )
                resp = await stub.ProbeNode(request, timeout=TIMEOUT)
        assert resp.done and resp.ok, resp.error
        assert resp.results and all(r.command_id == resp.command_id for r in resp.results)
        assert all(r.simulated and r.value > 0 and r.gpu == 1 for r in resp.results)
        assert {r.probe for r in resp.results} == {"gemm", "pcie"}

    asyncio.run(go())


def test_the_scheduler_probes_idle_nodes_periodically_and_leaves_busy_ones_alone(tmp_path: Path) -> None:
    probes = {"on_connect": False, "interval_seconds": 0.5, "jitter_ratio": 0.0, "check_every_seconds": 0.05}

    async def go() -> None:
        async with controller(probes=probes, stale_after_seconds=5) as (running, _):
            app = running.app
            stop = asyncio.Event()
            scheduler = asyncio.create_task(app.probing.schedule_forever(stop))
            idle = sim_agent(tmp_path, running.address, "idle", load=0.0)
            busy = sim_agent(tmp_path, running.address, "busy", load=0.95)
            try:
                async with agents_running(idle, busy):
                    # Three rounds: the first at once (never probed), then one per interval.
                    await until(lambda: app.probing.commands.sent["periodic"] >= 3, "three periodic rounds")
                    await until(lambda: not app.probing.commands.in_flight, "the last answer")
            finally:
                stop.set()
                await scheduler
            sent = [c for c in app.probing.commands.recent() if c.reason == "periodic"]
            assert {c.node for c in sent} == {"idle"}  # the busy node's GPUs run a job: never probed
            assert all(c.answered and c.ok for c in sent)
            gaps = [b.sent_at - a.sent_at for a, b in itertools.pairwise(sent)]
            assert all(gap >= 0.5 for gap in gaps), gaps  # one round per interval, not one per check
            assert {key[0] for key in app.fleet.probes} == {"idle"}  # the results, stored for detection
            assert app.probing.commands.failed == dict.fromkeys(app.probing.commands.failed, 0)

    asyncio.run(go())
