"""The operator API over real gRPC: node health, one node's detail, and findings filters and order."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import grpc
import pytest

from controller.fleet.findings import StoredFinding
from protos.gpufleet.v1 import bmc_pb2, findings_pb2, operator_pb2, operator_pb2_grpc
from protos.names import cause_name, health_name, severity_name
from tests.controller.harness import (
    FINDINGS,
    H100,
    STALE_AFTER,
    T0,
    Clock,
    Running,
    bmc_sample,
    config,
    frame,
    hello,
    populate,
    running_controller,
)

if TYPE_CHECKING:  # the async stub exists only in the generated type stubs
    Stub: TypeAlias = operator_pb2_grpc.OperatorAsyncStub

Body = Callable[[Running, "Stub", Clock], Awaitable[None]]


def serve(body: Body) -> None:
    async def go() -> None:
        clock = Clock()
        cfg = config(stale_after_seconds=STALE_AFTER)
        async with (
            running_controller(cfg, clock) as running,
            grpc.aio.insecure_channel(running.address) as channel,
        ):
            await body(running, operator_pb2_grpc.OperatorStub(channel), clock)

    asyncio.run(go())


def keys(findings: list[findings_pb2.Finding]) -> list[tuple[str, int | None, str, str, bool]]:
    return [
        (
            f.node,
            f.gpu if f.HasField("gpu") else None,
            cause_name(f.cause),
            severity_name(f.severity),
            f.active,
        )
        for f in findings
    ]


def test_list_nodes_reports_health_from_findings_and_silence() -> None:
    async def body(running: Running, stub: Stub, clock: Clock) -> None:
        assert (await stub.ListNodes(operator_pb2.ListNodesRequest())).nodes == []
        await populate(running.app, clock)
        nodes = (await stub.ListNodes(operator_pb2.ListNodesRequest())).nodes
        assert [(n.name, health_name(n.health), n.active_findings, n.connected) for n in nodes] == [
            ("a-healthy", "healthy", 0, True),  # its only finding is resolved
            ("b-degraded", "degraded", 2, True),
            ("c-critical", "critical", 3, True),
            ("d-stale", "stale", 1, False),  # silent past the stale timeout outranks its finding
            ("e-returned", "healthy", 0, False),  # not streaming, but seen just now
        ]
        a = nodes[0]
        assert (a.boot_id, a.agent_version, a.gpu_count, a.gpu_model, a.source) == (
            "b1",
            "test",
            2,
            H100,
            "sim",
        )
        assert a.acked_seq == 1 and nodes[4].acked_seq == 0  # e-returned's new boot has sent nothing
        assert a.last_seen.seconds == int(T0) and nodes[4].last_seen.seconds == int(clock.now)

        await running.app.ingest.hello(hello("d-stale", gpus=2))  # back: not stale, its finding shows
        running.app.connected("d-stale")
        nodes = (await stub.ListNodes(operator_pb2.ListNodesRequest())).nodes
        assert health_name(nodes[3].health) == "critical"

    serve(body)


def test_list_nodes_shows_what_the_agents_newest_hello_says() -> None:
    """The fields a summary reads from the Hello are kept with it: a new Hello shows at once."""

    async def body(running: Running, stub: Stub, clock: Clock) -> None:
        await running.app.ingest.hello(hello("n1", gpus=2))
        [first] = (await stub.ListNodes(operator_pb2.ListNodesRequest())).nodes
        await running.app.ingest.hello(hello("n1", "b2", gpus=4, agent_version="0.2.0"))
        [again] = (await stub.ListNodes(operator_pb2.ListNodesRequest())).nodes
        assert (first.boot_id, first.agent_version, first.gpu_count) == ("b1", "test", 2)
        assert (again.boot_id, again.agent_version, again.gpu_count) == ("b2", "0.2.0", 4)
        detail = await stub.GetNode(operator_pb2.GetNodeRequest(name="n1"))
        assert detail.summary == again

    serve(body)


def test_get_node_returns_its_state_and_active_findings_worst_first() -> None:
    async def body(running: Running, stub: Stub, clock: Clock) -> None:
        await populate(running.app, clock)
        f = frame(2, "c-critical")
        f.gpus.add(index=1, power_watts=350.0)
        f.gpus[0].index, f.gpus[1].index = 1, 0  # arrival order is not the answer's order
        f.host.load1 = 3.5
        f.probes.add(probe="gemm", variant="bf16", gpu=1, value=650.0, unit="TFLOP/s")
        f.probes.add(probe="nccl", variant="all_reduce", value=180.0, unit="GB/s")
        assert await running.app.ingest.frame("c-critical", f) == 2

        detail = await stub.GetNode(operator_pb2.GetNodeRequest(name="c-critical"))
        assert detail.summary.name == "c-critical" and detail.summary.acked_seq == 2
        assert detail.hello.node == "c-critical" and len(detail.hello.inventory.gpus) == 2
        assert [(g.index, g.power_watts) for g in detail.gpus] == [(0, 350.0), (1, 402.0)]
        assert detail.host.load1 == 3.5
        assert [(p.probe, p.gpu if p.HasField("gpu") else None, p.value) for p in detail.probes] == [
            ("gemm", 0, 702.0),
            ("gemm", 1, 650.0),
            ("nccl", None, 180.0),
        ]
        assert keys(list(detail.findings)) == [
            ("c-critical", None, "nvlink_down", "critical", True),
            ("c-critical", 1, "ecc_row_remap_pending", "critical", True),
            ("c-critical", 0, "thermal_throttle", "warning", True),
        ]
        ev = detail.findings[0].evidence
        assert (ev.metric, ev.value, ev.baseline, ev.peers, list(ev.reasons)) == (
            "enforced_power_limit_watts",
            400.0,
            700.0,
            7,
            ["sw_power_cap"],
        )
        assert not ev.HasField("held_seconds")  # None in the finding: absent on the wire
        assert detail.findings[0].first_seen.seconds == int(T0 - 100)
        assert list(detail.findings[0].detectors) == ["throttle"]

        healthy = await stub.GetNode(operator_pb2.GetNodeRequest(name="a-healthy"))
        assert list(healthy.findings) == [] and not healthy.HasField("host")

    serve(body)


@pytest.mark.parametrize("name", ["nope", ""])
def test_get_node_of_an_unknown_name_is_not_found(name: str) -> None:
    async def body(running: Running, stub: Stub, clock: Clock) -> None:
        await populate(running.app, clock)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetNode(operator_pb2.GetNodeRequest(name=name))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert f"node {name!r} is not known" in (caught.value.details() or "")
        assert len((await stub.ListNodes(operator_pb2.ListNodesRequest())).nodes) == 5  # still serving

    serve(body)


def test_list_findings_filters_and_orders_worst_first() -> None:
    async def body(running: Running, stub: Stub, clock: Clock) -> None:
        await populate(running.app, clock)

        async def listed(**request: object) -> list[tuple[str, int | None, str, str, bool]]:
            response = await stub.ListFindings(operator_pb2.ListFindingsRequest(**request))  # type: ignore[arg-type]
            return keys(list(response.findings))

        assert await listed() == [
            ("c-critical", None, "nvlink_down", "critical", True),
            ("c-critical", 1, "ecc_row_remap_pending", "critical", True),
            ("d-stale", 0, "ecc_row_remap_pending", "critical", True),
            ("b-degraded", 1, "power_cap", "warning", True),
            ("c-critical", 0, "thermal_throttle", "warning", True),
            ("b-degraded", 0, "hbm_degraded", "info", True),
        ]
        assert await listed(node="b-degraded") == [
            ("b-degraded", 1, "power_cap", "warning", True),
            ("b-degraded", 0, "hbm_degraded", "info", True),
        ]
        assert await listed(node="a-healthy") == []
        assert await listed(node="a-healthy", include_resolved=True) == [
            ("a-healthy", 0, "slow_unknown", "info", False)
        ]
        with_resolved = await listed(include_resolved=True)
        assert len(with_resolved) == len(FINDINGS)
        assert [k[3] for k in with_resolved] == ["critical"] * 3 + ["warning"] * 2 + ["info"] * 2
        assert await listed(min_severity=findings_pb2.SEVERITY_CRITICAL, node="c-critical") == [
            ("c-critical", None, "nvlink_down", "critical", True),
            ("c-critical", 1, "ecc_row_remap_pending", "critical", True),
        ]
        warning_up = await listed(min_severity=findings_pb2.SEVERITY_WARNING, include_resolved=True)
        assert {k[3] for k in warning_up} == {"critical", "warning"} and len(warning_up) == 5
        assert await listed(node="nobody") == []

    serve(body)


def test_finding_ids_are_stable_on_the_wire() -> None:
    async def body(running: Running, stub: Stub, clock: Clock) -> None:
        await populate(running.app, clock)
        response = await stub.ListFindings(operator_pb2.ListFindingsRequest(include_resolved=True))
        expected: dict[str, StoredFinding] = {s.id: s for s in FINDINGS}
        assert {f.id for f in response.findings} == set(expected)
        for f in response.findings:
            stored = expected[f.id]
            assert (f.node, f.summary, f.active) == (
                stored.finding.node,
                stored.finding.summary,
                stored.active,
            )
            assert f.last_seen.ToNanoseconds() == int(stored.last_seen * 1e9)

    serve(body)


def test_get_node_returns_the_latest_bmc_sample_across_a_restart(tmp_path: Path) -> None:
    cfg = config(db=str(tmp_path / "fleet.db"))
    sample = bmc_sample(T0 - 5, "n1")

    async def get(running: Running, name: str) -> operator_pb2.NodeDetail:
        async with grpc.aio.insecure_channel(running.address) as channel:
            return await operator_pb2_grpc.OperatorStub(channel).GetNode(
                operator_pb2.GetNodeRequest(name=name)
            )

    async def first() -> None:
        async with running_controller(cfg) as running:
            for name in ("n1", "n2"):
                await running.app.ingest.hello(hello(name))
            f = frame(1, "n1")
            f.bmc.CopyFrom(sample)
            f.bmc.fans[0].speed_rpm = math.nan  # cleared at ingest, so absent on the wire
            await running.app.ingest.frame("n1", f)
            await running.app.ingest.frame("n1", frame(2, "n1"))  # no BMC section: the sample stays
            await running.app.ingest.frame("n2", frame(1, "n2"))
            detail = await get(running, "n1")
            assert detail.HasField("bmc") and detail.bmc.endpoint == "https://bmc-n1.example"
            assert not detail.bmc.fans[0].HasField("speed_rpm")
            assert not (await get(running, "n2")).HasField("bmc")  # no BMC read: none shown

    async def after_restart() -> None:
        async with running_controller(cfg) as running:
            detail = await get(running, "n1")
            expected = bmc_pb2.BmcSample()
            expected.CopyFrom(sample)
            expected.fans[0].ClearField("speed_rpm")
            assert detail.bmc == expected
            assert detail.bmc.time.ToNanoseconds() == int((T0 - 5) * 1e9)
            assert [(g.index, g.temperature_celsius) for g in detail.bmc.gpus] == [(0, 63.0), (1, 71.0)]
            assert not (await get(running, "n2")).HasField("bmc")

    asyncio.run(first())
    asyncio.run(after_restart())
