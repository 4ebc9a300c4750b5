"""Ack, silence and maintenance over real gRPC on 127.0.0.1: acks shown on findings and audited,
silences that hide findings until they expire (an injected clock) or are ended, refusals, nodes
under maintenance (marked, their findings silenced, no recommendation, no probe), and all of it
across a controller restart on the same store."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import grpc

from controller.config import ProbeConfig
from controller.fleet.findings import StoredFinding
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import cause_name
from tests.controller.harness import (
    Clock,
    Running,
    add_findings,
    config,
    hello,
    running_controller,
    stored_finding,
)
from tests.controller.remediate.test_retune import fleet_of_five, rows
from tests.controller.test_probe_node import controller as probing_controller
from tests.controller.test_probe_node import scripted_agent, status_of, until

if TYPE_CHECKING:  # the async stubs exist only in the generated type stubs
    Stub: TypeAlias = operator_pb2_grpc.OperatorAsyncStub

HOUR = 3600.0


@contextlib.asynccontextmanager
async def controller(
    db: str = ":memory:", clock: Clock | None = None
) -> AsyncIterator[tuple[Running, Stub, Clock]]:
    """A controller on a clock the test moves (starting now: frames are stamped with the real time)."""
    clock = clock or Clock(time.time())
    cfg = config(db=db, probes=ProbeConfig(on_connect=False, periodic=False))
    async with (
        running_controller(cfg, clock) as running,
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        yield running, operator_pb2_grpc.OperatorStub(channel), clock


async def found(running: Running, node: str, gpu: int, cause: str) -> StoredFinding:
    """An active finding, first seen 100 s ago, as a detection pass would leave it."""
    finding = stored_finding(node, gpu, cause, "warning", first_seen=running.app.clock() - 100)
    await add_findings(running.app, [finding])
    return finding


async def listed(stub: Stub, **request: object) -> list[tuple[str, str, str]]:
    """(node, cause, silenced_by) of every finding ListFindings answers, every page."""
    out: list[tuple[str, str, str]] = []
    token = ""
    while True:
        resp = await stub.ListFindings(operator_pb2.ListFindingsRequest(page_token=token, **request))  # type: ignore[arg-type]
        out += [(f.node, cause_name(f.cause), f.silenced_by) for f in resp.findings]
        token = resp.next_page_token
        if not token:
            return out


async def summary(stub: Stub, node: str) -> operator_pb2.NodeSummary:
    return (await stub.GetNode(operator_pb2.GetNodeRequest(name=node))).summary


async def audit(stub: Stub, action: str) -> list[operator_pb2.AuditEntry]:
    entries = (await stub.ListAudit(operator_pb2.ListAuditRequest())).entries
    return [e for e in entries if e.action == action]


def test_an_ack_is_stored_shown_on_the_finding_and_audited() -> None:
    async def go() -> None:
        async with controller() as (running, stub, clock):
            await fleet_of_five(running.app)
            capped = await found(running, "n0", 0, "power_cap")
            acked = await stub.AckFinding(
                operator_pb2.AckFindingRequest(finding_id=capped.id, comment="on it")
            )
            assert (acked.id, acked.node, acked.ack.comment) == (capped.id, "n0", "on it")
            assert acked.ack.by.startswith("anonymous from ") and acked.ack.time.seconds == int(clock.now)
            [shown] = (await stub.ListFindings(operator_pb2.ListFindingsRequest())).findings
            assert shown.ack == acked.ack and shown.silenced_by == ""  # acked, not silenced: still listed
            [entry] = await audit(stub, "ack")
            assert (entry.node, list(entry.finding_ids), entry.reason, entry.outcome) == (
                "n0",
                [capped.id],
                "on it",
                "succeeded",
            )
            assert entry.requester == acked.ack.by
            code, _ = await status_of(stub.AckFinding(operator_pb2.AckFindingRequest(finding_id="nope")))
            assert code == grpc.StatusCode.NOT_FOUND
            refused = [e for e in await audit(stub, "ack") if e.outcome == "refused"]
            assert [list(e.finding_ids) for e in refused] == [["nope"]]

    asyncio.run(go())


def test_a_silence_hides_its_findings_until_it_expires() -> None:
    async def go() -> None:
        async with controller() as (running, stub, clock):
            await fleet_of_five(running.app)
            await found(running, "n0", 0, "power_cap")
            await found(running, "n0", 1, "thermal_throttle")
            assert (await summary(stub, "n0")).active_findings == 2
            s = await stub.Silence(
                operator_pb2.SilenceRequest(
                    node="n0", cause="power_cap", duration_seconds=2 * HOUR, comment="known"
                )
            )
            assert (s.node, s.cause, s.comment, s.active) == ("n0", "power_cap", "known", True)
            assert s.ends.seconds - s.starts.seconds == 2 * HOUR and s.by.startswith("anonymous from ")
            assert await listed(stub) == [("n0", "thermal_throttle", "")]
            assert sorted(await listed(stub, include_silenced=True)) == [
                ("n0", "power_cap", s.id),
                ("n0", "thermal_throttle", ""),
            ]
            assert (await summary(stub, "n0")).active_findings == 1
            detail = await stub.GetNode(operator_pb2.GetNodeRequest(name="n0"))  # the node view lists both
            assert sorted((cause_name(f.cause), f.silenced_by) for f in detail.findings) == [
                ("power_cap", s.id),
                ("thermal_throttle", ""),
            ]
            assert [x.id for x in (await stub.ListSilences(operator_pb2.ListSilencesRequest())).silences] == [
                s.id
            ]
            [entry] = await audit(stub, "silence")
            assert (entry.node, entry.outcome, entry.reason) == ("n0", "succeeded", "known")

            clock.now += 2 * HOUR  # over: no restart, no timer
            assert sorted(await listed(stub)) == [("n0", "power_cap", ""), ("n0", "thermal_throttle", "")]
            assert (await stub.ListSilences(operator_pb2.ListSilencesRequest())).silences == []
            [old] = (await stub.ListSilences(operator_pb2.ListSilencesRequest(include_expired=True))).silences
            assert (old.id, old.active) == (s.id, False)

    asyncio.run(go())


def test_unsilence_ends_a_silence_of_every_cause_at_once() -> None:
    async def go() -> None:
        async with controller() as (running, stub, clock):
            await fleet_of_five(running.app)
            await found(running, "n0", 0, "power_cap")
            await found(running, "n1", 0, "power_cap")
            s = await stub.Silence(operator_pb2.SilenceRequest(node="n0", duration_seconds=HOUR))
            assert s.cause == "" and await listed(stub) == [("n1", "power_cap", "")]
            clock.now += 60
            ended = await stub.Unsilence(operator_pb2.UnsilenceRequest(id=s.id, comment="fixed"))
            assert (ended.active, ended.ends.seconds) == (False, int(clock.now))
            assert sorted(await listed(stub)) == [("n0", "power_cap", ""), ("n1", "power_cap", "")]
            [entry] = await audit(stub, "unsilence")
            assert (entry.node, entry.reason, entry.outcome) == ("n0", "fixed", "succeeded")
            code, _ = await status_of(stub.Unsilence(operator_pb2.UnsilenceRequest(id="nope")))
            assert code == grpc.StatusCode.NOT_FOUND

    asyncio.run(go())


def test_bad_silences_are_refused_and_audited() -> None:
    async def go() -> None:
        async with controller() as (running, stub, _):
            await fleet_of_five(running.app)
            bad = [
                (operator_pb2.SilenceRequest(node="ghost", duration_seconds=60), grpc.StatusCode.NOT_FOUND),
                (operator_pb2.SilenceRequest(node="", duration_seconds=60), grpc.StatusCode.INVALID_ARGUMENT),
                (
                    operator_pb2.SilenceRequest(node="n0", cause="overheating", duration_seconds=60),
                    grpc.StatusCode.INVALID_ARGUMENT,
                ),
                (
                    operator_pb2.SilenceRequest(node="n0", duration_seconds=0),
                    grpc.StatusCode.INVALID_ARGUMENT,
                ),
                (
                    operator_pb2.SilenceRequest(node="n0", duration_seconds=-5),
                    grpc.StatusCode.INVALID_ARGUMENT,
                ),
                (
                    operator_pb2.SilenceRequest(node="n0", duration_seconds=31 * 24 * HOUR),
                    grpc.StatusCode.INVALID_ARGUMENT,
                ),
            ]
            for request, expected in bad:
                code, details = await status_of(stub.Silence(request))
                assert code == expected, (request, details)
            code, details = await status_of(
                stub.Silence(operator_pb2.SilenceRequest(node="n0", cause="x", duration_seconds=1))
            )
            assert "unknown cause 'x'" in details
            entries = await audit(stub, "silence")
            assert len(entries) == len(bad) + 1 and {e.outcome for e in entries} == {"refused"}
            assert running.app.silencing.silences == {}
            assert (
                await stub.ListSilences(operator_pb2.ListSilencesRequest(include_expired=True))
            ).silences == []
            code, _ = await status_of(
                stub.SetMaintenance(operator_pb2.SetMaintenanceRequest(node="ghost", on=True))
            )
            assert code == grpc.StatusCode.NOT_FOUND

    asyncio.run(go())


def test_maintenance_marks_the_node_silences_its_findings_and_stops_recommendations() -> None:
    async def go() -> None:
        async with controller() as (running, stub, _):
            app = running.app
            await fleet_of_five(app)
            await found(running, "n0", 0, "power_cap")
            await app.tuning.after_pass()
            assert [(r.node, r.state) for r in rows(app)] == [("n0", "proposed")]

            on = await stub.SetMaintenance(
                operator_pb2.SetMaintenanceRequest(node="n0", on=True, comment="PSU swap")
            )
            assert (on.node, on.changed) == ("n0", True) and on.audit_id
            again = await stub.SetMaintenance(operator_pb2.SetMaintenanceRequest(node="n0", on=True))
            assert again.changed is False and "already under maintenance" in again.detail
            n0 = await summary(stub, "n0")
            assert (n0.maintenance, n0.maintenance_comment, n0.active_findings) == (True, "PSU swap", 0)
            assert n0.health == operator_pb2.NODE_HEALTH_HEALTHY  # what is left needs nobody's attention
            assert not (await summary(stub, "n1")).maintenance
            assert await listed(stub) == []
            assert await listed(stub, include_silenced=True) == [("n0", "power_cap", "maintenance")]
            await app.tuning.after_pass()
            assert rows(app) == []  # the proposal went with the finding's silence

            off = await stub.SetMaintenance(
                operator_pb2.SetMaintenanceRequest(node="n0", on=False, comment="done")
            )
            assert off.changed is True and not (await summary(stub, "n0")).maintenance
            await app.tuning.after_pass()
            assert [(r.node, r.state) for r in rows(app)] == [("n0", "proposed")]
            entries = await audit(stub, "maintenance")
            assert sorted((e.node, e.reason, e.outcome) for e in entries) == [  # one clock time: no order
                ("n0", "", "succeeded"),
                ("n0", "PSU swap", "succeeded"),
                ("n0", "done", "succeeded"),
            ]

    asyncio.run(go())


def test_a_silenced_finding_drives_no_recommendation() -> None:
    async def go() -> None:
        async with controller() as (running, stub, clock):
            app = running.app
            await fleet_of_five(app)
            await found(running, "n0", 0, "power_cap")
            await stub.Silence(
                operator_pb2.SilenceRequest(node="n0", cause="power_cap", duration_seconds=HOUR)
            )
            await app.tuning.after_pass()
            assert rows(app) == []
            clock.now += HOUR
            await app.tuning.after_pass()
            assert [(r.node, r.cause) for r in rows(app)] == [("n0", "power_cap")]

    asyncio.run(go())


def idle_frame(node: str) -> pb.AgentMessage:
    f = pb.TelemetryFrame(node=node, boot_id="b1", seq=1)
    f.time.FromNanoseconds(time.time_ns())
    for i in range(2):
        f.gpus.add(index=i, gpu_utilization_ratio=0.0)
    return pb.AgentMessage(frame=f)


def test_a_node_under_maintenance_is_not_probed_on_schedule() -> None:
    async def go() -> None:
        async with probing_controller({"periodic": True}) as (running, stub), scripted_agent(running) as call:
            await call.write(idle_frame("n1"))
            await until(lambda: len(running.app.fleet.nodes["n1"].gpus) == 2, "idle readings")
            await stub.SetMaintenance(operator_pb2.SetMaintenanceRequest(node="n1", on=True))
            assert await running.app.probing.schedule_pass() == []
            await stub.SetMaintenance(operator_pb2.SetMaintenanceRequest(node="n1", on=False))
            assert [c.node for c in await running.app.probing.schedule_pass()] == ["n1"]

    asyncio.run(go())


def test_a_node_under_maintenance_gets_no_probe_on_connect() -> None:
    async def go() -> None:
        async with probing_controller({"on_connect": True}) as (running, stub):
            for node in ("n1", "n2"):
                await running.app.ingest.hello(hello(node, boot="b0"))
            await stub.SetMaintenance(operator_pb2.SetMaintenanceRequest(node="n1", on=True))
            async with scripted_agent(running, "n1"), scripted_agent(running, "n2"):
                await until(lambda: "n2" in running.app.probing.commands.in_flight, "n2's probe on connect")
                assert "n1" not in running.app.probing.commands.in_flight

    asyncio.run(go())


def test_acks_silences_and_maintenance_survive_a_restart(tmp_path: Path) -> None:
    async def go() -> None:
        db = str(tmp_path / "store.db")
        async with controller(db) as (running, stub, clock):
            await fleet_of_five(running.app)
            capped = await found(running, "n0", 0, "power_cap")
            await stub.AckFinding(operator_pb2.AckFindingRequest(finding_id=capped.id, comment="seen"))
            s = await stub.Silence(
                operator_pb2.SilenceRequest(node="n0", cause="power_cap", duration_seconds=HOUR)
            )
            await stub.SetMaintenance(operator_pb2.SetMaintenanceRequest(node="n1", on=True, comment="bios"))
        async with controller(db, clock) as (_, stub, _):
            assert [x.id for x in (await stub.ListSilences(operator_pb2.ListSilencesRequest())).silences] == [
                s.id
            ]
            n1 = await summary(stub, "n1")
            assert (n1.maintenance, n1.maintenance_comment) == (True, "bios")
            assert await listed(stub) == []
            [f] = (await stub.ListFindings(operator_pb2.ListFindingsRequest(include_silenced=True))).findings
            assert (f.id, f.ack.comment, f.silenced_by) == (capped.id, "seen", s.id)
            ended = await stub.Unsilence(operator_pb2.UnsilenceRequest(id=s.id))
            assert not ended.active and await listed(stub) == [("n0", "power_cap", "")]

    asyncio.run(go())


def test_list_findings_since_and_silenced_ones_among_the_resolved() -> None:
    async def go() -> None:
        async with controller() as (running, stub, clock):
            await fleet_of_five(running.app)
            now = clock.now
            await add_findings(
                running.app,
                [
                    stored_finding(
                        "n0", 0, "power_cap", "warning", first_seen=now - 1000
                    ),  # last seen now-950
                    stored_finding("n1", 0, "power_cap", "warning", first_seen=now - 100),
                    stored_finding("n2", 0, "power_cap", "warning", first_seen=now - 100),
                    stored_finding("n3", 0, "power_cap", "warning", first_seen=now - 100, active=False),
                    stored_finding("n4", 0, "power_cap", "warning", first_seen=now - 1000, active=False),
                ],
            )
            since = operator_pb2.ListFindingsRequest().since
            since.FromSeconds(int(now - 500))
            assert [n for n, _, _ in await listed(stub, since=since)] == ["n1", "n2"]
            await stub.Silence(operator_pb2.SilenceRequest(node="n1", duration_seconds=HOUR))
            assert [n for n, _, _ in await listed(stub, since=since)] == ["n2"]
            # From the store, a page at a time: the silenced one skipped, every other listed once.
            resolved = await listed(stub, include_resolved=True, page_size=1)
            assert [n for n, _, _ in resolved] == ["n0", "n2", "n3", "n4"]
            assert [n for n, _, _ in await listed(stub, include_resolved=True, since=since, page_size=1)] == [
                "n2",
                "n3",
            ]
            assert [
                n for n, _, _ in await listed(stub, include_resolved=True, include_silenced=True, since=since)
            ] == [
                "n1",
                "n2",
                "n3",
            ]

    asyncio.run(go())
