"""The tuning service against a real controller over gRPC on 127.0.0.1, with fake agents that answer
ApplyProfile on the real command channel: the policy (off, recommend, auto), approve and retune,
the breaker (a rolled-back apply keeps its place; a refusal is RESOURCE_EXHAUSTED), a fix needing a
reboot never applied automatically, a dry run writing nothing but its audit entry, clear and
audited refusals, no answer in time, and an apply in flight across a controller restart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from controller.app import ControllerApp
from controller.config import BreakerConfig, ProbeConfig, TuningConfig
from controller.servicer import EOF
from controller.store.recommendations import Recommendation
from protos.gpufleet.v1 import bmc_pb2, operator_pb2, operator_pb2_grpc, telemetry_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import (
    Running,
    add_findings,
    as_hello,
    config,
    hello,
    running_controller,
    stored_finding,
)
from tests.controller.test_probe_node import status_of, until

if TYPE_CHECKING:  # the async stubs exist only in the generated type stubs
    OperatorStub: TypeAlias = operator_pb2_grpc.OperatorAsyncStub

Answer = Callable[[pb.Command], pb.ApplyProfileResult | None]
NODES = [f"n{i}" for i in range(5)]


def committed(command: pb.Command) -> pb.ApplyProfileResult:
    return pb.ApplyProfileResult(
        state="planned" if command.apply_profile.dry_run else "committed",
        changes=[pb.SettingChange(setting="gpu[0].power_limit", current="300", target="700")],
        op_id="op-1",
    )


def rolled_back(command: pb.Command) -> pb.ApplyProfileResult:
    check = pb.ProbeCheck(probe="gemm", variant="bf16", gpu=0, value=500.0, normal=665.0, before=420.0)
    return pb.ApplyProfileResult(state="rolled_back", checks=[check], problems=["gemm/bf16 on GPU 0 missed"])


@dataclass
class FakeAgent:
    """A node's Telemetry stream that answers every ApplyProfile with `answer` (None: stays silent)."""

    call: Any
    answer: Answer
    commands: list[pb.Command] = field(default_factory=list)

    async def serve(self) -> None:
        while (msg := await self.call.read()) != EOF:
            assert isinstance(msg, pb.ControllerMessage)
            if msg.WhichOneof("msg") != "command" or msg.command.WhichOneof("action") != "apply_profile":
                continue
            self.commands.append(msg.command)
            result = self.answer(msg.command)
            if result is not None:
                await self.reply(msg.command.id, result)

    async def reply(self, command_id: str, result: pb.ApplyProfileResult) -> None:
        ok = result.state in ("committed", "planned", "nothing_to_do")
        answer = pb.CommandResult(
            command_id=command_id, ok=ok, error="" if ok else result.state, apply_profile=result
        )
        await self.call.write(pb.AgentMessage(command_result=answer))


@contextlib.asynccontextmanager
async def agent(
    running: Running, node: str, answer: Answer = committed, *, tuning: bool = True
) -> AsyncIterator[FakeAgent]:
    async with grpc.aio.insecure_channel(running.address) as channel:
        call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(None)
        capabilities = ["run_probes", "apply_profile"] if tuning else ["run_probes"]
        await call.write(as_hello(hello(node, gpus=2, capabilities=capabilities, probes=["gemm"])))
        await until(
            lambda: node in running.app.fleet.nodes and running.app.fleet.nodes[node].connected, "hello"
        )
        fake = FakeAgent(call, answer)
        task = asyncio.create_task(fake.serve())
        try:
            yield fake
        finally:
            task.cancel()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await task


def telemetry(node: str, gemm: float = 700.0, limit: float = 700.0) -> pb.TelemetryFrame:
    f = pb.TelemetryFrame(node=node, boot_id="b1", seq=1)
    f.time.FromNanoseconds(time.time_ns())
    for i in range(2):
        f.gpus.add(
            index=i,
            power_management_limit_watts=limit if i == 0 else 700.0,
            enforced_power_limit_watts=limit if i == 0 else 700.0,
            default_power_limit_watts=700.0,
        )
        value = gemm if i == 0 else 700.0
        f.probes.add(probe="gemm", variant="bf16", gpu=i, value=value, unit="TFLOP/s")
    return f


async def fleet_of_five(app: ControllerApp) -> None:
    """n0..n4 with 2 H100s each and a gemm result per GPU; n0's GPU 0 capped at 300 W and slow."""
    for name in NODES:
        if name not in app.fleet.nodes:
            await app.ingest.hello(hello(name, gpus=2, probes=["gemm"]))
        capped = name == "n0"
        await app.ingest.frame(name, telemetry(name, 420.0 if capped else 700.0, 300.0 if capped else 700.0))


@contextlib.asynccontextmanager
async def controller(
    policy: dict[str, str] | None = None, **overrides: Any
) -> AsyncIterator[tuple[Running, OperatorStub]]:
    cfg = config(
        probes=ProbeConfig(on_connect=False, periodic=False),
        tuning=TuningConfig(policy=policy or {}),
        **overrides,
    )
    async with (
        running_controller(cfg, clock=time.time) as running,
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        yield running, operator_pb2_grpc.OperatorStub(channel)


def rows(app: ControllerApp) -> list[Recommendation]:
    return sorted(app.tuning.recs.values(), key=lambda r: r.created)


def concluded(app: ControllerApp, state: str) -> bool:
    """The first row reached `state` and its breaker slot has its outcome (stored after the row)."""
    return rows(app)[0].state == state and all(a.outcome != "in_progress" for a in app.breaker.state.actions)


async def power_cap(app: ControllerApp, node: str = "n0") -> str:
    finding = stored_finding(node, 0, "power_cap", "warning", first_seen=time.time())
    await add_findings(app, [finding])
    return finding.id


def test_auto_applies_an_online_fix_and_a_committed_answer_verifies_it() -> None:
    async def go() -> None:
        async with controller({"power_cap": "auto"}) as (running, stub), agent(running, "n0") as n0:
            app = running.app
            await fleet_of_five(app)
            fid = await power_cap(app)
            await app.tuning.after_pass()
            await until(lambda: concluded(app, "verified"), "the apply to be verified")
            [rec] = rows(app)
            assert (rec.cause, rec.profile, rec.policy, rec.requester, rec.finding_ids) == (
                "power_cap",
                "gpu-defaults",
                "auto",
                "policy",
                [fid],
            )
            [command] = n0.commands
            apply = command.apply_profile
            assert command.id == rec.command_id and not apply.dry_run
            assert (apply.profile, list(apply.gpus), apply.recommendation_id) == ("gpu-defaults", [0], rec.id)
            assert json.loads(apply.targets_json) == {"gpu": {"power_limit": "default"}}
            [bar] = apply.verify  # gemm on GPU 0 against its 10 peers (median 700)
            assert (bar.probe, bar.variant, bar.gpu, bar.before) == ("gemm", "bf16", 0, 420.0)
            assert bar.normal == 665.0 and bar.higher_is_better and bar.better_by == 0.05
            [action] = app.breaker.state.actions
            assert (action.node, action.kind, action.outcome) == ("n0", "retune", "succeeded")
            [entry] = await app.store.list_audit()
            assert (entry.action, entry.requester, entry.outcome, entry.findings) == (
                "retune",
                "policy",
                "succeeded",
                [fid],
            )
            assert entry.parameters["recommendation_id"] == rec.id
            # the same finding, still active, is not proposed again
            await app.tuning.after_pass()
            assert len(rows(app)) == 1 and len(n0.commands) == 1
            listed = await stub.ListRecommendations(operator_pb2.ListRecommendationsRequest(node="n0"))
            [msg] = listed.recommendations
            assert (msg.id, msg.state, msg.result.state, msg.risk) == (
                rec.id,
                "verified",
                "committed",
                "online",
            )
            assert [(c.setting, c.current, c.target) for c in msg.changes] == [
                ("gpu[0].power_limit", "300 W", "default (700 W)")
            ]

    asyncio.run(go())


def test_recommend_proposes_approve_applies_and_off_proposes_nothing() -> None:
    async def go() -> None:
        async with controller({"clocks_locked_low": "off"}) as (running, stub), agent(running, "n0") as n0:
            app = running.app
            await fleet_of_five(app)
            await power_cap(app)
            await add_findings(app, [stored_finding("n1", 0, "clocks_locked_low", "warning")])
            await app.tuning.after_pass()
            [rec] = rows(app)  # nothing for the cause the policy turns off
            assert (rec.state, rec.policy, rec.cause) == ("proposed", "recommend", "power_cap")
            assert n0.commands == []
            resp = await stub.Approve(
                operator_pb2.ApproveRequest(id=rec.id, reason="capped by hand", wait=True)
            )
            assert resp.done and resp.result.state == "committed" and resp.recommendation_id == rec.id
            assert (rec.state, rec.requester.startswith("anonymous from "), rec.reason) == (
                "verified",
                True,
                "capped by hand",
            )
            code, details = await status_of(stub.Approve(operator_pb2.ApproveRequest(id=rec.id)))
            assert (code, details) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                f"recommendation {rec.id} is verified, not proposed",
            )
            code, _ = await status_of(stub.Approve(operator_pb2.ApproveRequest(id="nope")))
            assert code == grpc.StatusCode.NOT_FOUND

    asyncio.run(go())


def test_a_cleared_finding_drops_its_proposal() -> None:
    async def go() -> None:
        async with controller() as (running, _):
            app = running.app
            await fleet_of_five(app)
            await power_cap(app, "n2")
            await app.tuning.after_pass()
            assert [r.state for r in rows(app)] == ["proposed"]
            app.active.clear()
            await app.tuning.after_pass()
            assert rows(app) == [] and await app.store.list_recommendations() == []

    asyncio.run(go())


def test_a_rolled_back_apply_keeps_its_breaker_place_and_the_next_node_is_refused() -> None:
    async def go() -> None:
        async with (
            controller({"power_cap": "auto"}) as (running, stub),
            agent(running, "n0", rolled_back) as n0,
            agent(running, "n1") as n1,
        ):
            app = running.app
            await fleet_of_five(app)
            await power_cap(app, "n0")
            await app.tuning.after_pass()
            await until(lambda: concluded(app, "rolled_back"), "the rollback")
            assert "gemm bf16 on GPU 0: 500, normal 665, before 420" in rows(app)[0].detail
            [action] = app.breaker.state.actions
            assert (action.node, action.outcome) == ("n0", "rolled_back")  # still in the window
            # n1 (5 nodes: budget 1): the policy's apply waits for the budget instead of tripping it
            await power_cap(app, "n1")
            await app.tuning.after_pass()
            waiting = rows(app)[1]
            assert waiting.state == "approved" and waiting.detail.startswith(
                "waiting: the breaker's budget: 1 of 1"
            )
            assert n1.commands == [] and not app.breaker.state.tripped
            # an operator's retune asks the breaker, which refuses it and trips
            request = operator_pb2.RetuneRequest(node="n1", profile="gpu-defaults", reason="try")
            code, details = await status_of(stub.Retune(request))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "1 of 1 nodes already in action" in details
            assert app.breaker.state.tripped and n1.commands == [] and len(n0.commands) == 1
            assert len(rows(app)) == 2  # the refused retune left no row
            entries = await app.store.list_audit(node="n1")
            assert [(e.action, e.outcome) for e in entries] == [("retune", "refused")]

    asyncio.run(go())


def test_a_fix_needing_a_reboot_is_never_automatic_and_approve_applies_it() -> None:
    async def go() -> None:
        async with controller({"bios_drift": "auto"}) as (running, stub), agent(running, "n0") as n0:
            app = running.app
            await fleet_of_five(app)
            for name, node in app.fleet.nodes.items():
                node.bmc = bmc_pb2.BmcSample(
                    bios_attributes={"PcieAcsControl": "Enabled" if name == "n0" else "Disabled"}
                )
            await add_findings(app, [stored_finding("n0", None, "bios_drift", "warning")])
            await app.tuning.after_pass()
            [rec] = rows(app)
            assert (rec.state, rec.policy, rec.risk, rec.profile) == (
                "proposed",
                "auto",
                "needs_reboot",
                "bios-fleet-value",
            )
            assert "needs an approval" in rec.detail and n0.commands == []
            n0.answer = lambda c: pb.ApplyProfileResult(
                state="committed",
                changes=[
                    pb.SettingChange(
                        setting="bmc.bios.PcieAcsControl",
                        current="Enabled",
                        target="Disabled",
                        pending_reboot=True,
                    )
                ],
            )
            resp = await stub.Approve(operator_pb2.ApproveRequest(id=rec.id, wait=True))
            assert resp.done and resp.result.state == "committed"
            [command] = n0.commands
            assert json.loads(command.apply_profile.targets_json) == {
                "bmc": {"bios": {"PcieAcsControl": "Disabled"}}
            }
            assert list(command.apply_profile.verify) == []  # BIOS: read back only
            assert (
                rec.state == "verified" and "pending the next reboot: bmc.bios.PcieAcsControl" in rec.detail
            )

    asyncio.run(go())


def test_a_dry_run_writes_nothing_but_its_audit_entry(tmp_path: Path) -> None:
    db = tmp_path / "c.db"

    async def go() -> None:
        async with controller(db=str(db)) as (running, stub), agent(running, "n0") as n0:
            app = running.app
            await fleet_of_five(app)
            request = operator_pb2.RetuneRequest(
                node="n0",
                profile="gpu-defaults",
                dry_run=True,
                gpus=[0],
                wait=True,
                reason="what would change",
            )
            resp = await stub.Retune(request)
            assert resp.done and resp.result.state == "planned" and resp.recommendation_id == ""
            [command] = n0.commands
            assert command.apply_profile.dry_run and list(command.apply_profile.verify) == []
            await app.tuning.settled()
            assert app.breaker.state.actions == () and rows(app) == []
            [entry] = await app.store.list_audit()
            assert (entry.id, entry.action, entry.outcome, entry.reason) == (
                resp.audit_id,
                "retune",
                "succeeded",
                "what would change",
            )
            assert entry.parameters == {"profile": "gpu-defaults", "gpus": [0], "dry_run": True}
            assert entry.detail.startswith("dry run: planned")

    asyncio.run(go())
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM recommendations").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM audit").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM breaker").fetchone() == (0,)
        # the command channel's own record of what it sent (kept for every command)
        assert conn.execute("SELECT kind, state FROM commands").fetchall() == [("apply_profile", "succeeded")]


def test_refusals_are_clear_and_audited() -> None:
    async def go() -> None:
        async with (
            controller() as (running, stub),
            agent(running, "n0"),
            agent(running, "plain", tuning=False),
        ):
            app = running.app
            await fleet_of_five(app)
            req = operator_pb2.RetuneRequest
            cases = [
                (
                    req(node="ghost", profile="gpu-defaults"),
                    grpc.StatusCode.NOT_FOUND,
                    "node 'ghost' is not known",
                ),
                (req(node="n0", profile="nope"), grpc.StatusCode.NOT_FOUND, "no profile 'nope'"),
                (
                    req(node="n0", profile="gpu-defaults", gpus=[7]),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "has no GPU 7",
                ),
                (
                    req(node="n2", profile="gpu-defaults"),
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "node n2 is not connected",
                ),
                (
                    req(node="plain", profile="gpu-defaults"),
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "does not accept tuning: its agent's config does not say tuning.enabled: true",
                ),
                (
                    req(node="n0", profile="firmware-fleet-baseline"),
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "recommend only",
                ),
            ]
            for request, code, text in cases:
                got, details = await status_of(stub.Retune(request))
                assert got == code and text in details, (request, got, details)
            entries = await app.store.list_audit()
            assert len(entries) == len(cases) and {e.outcome for e in entries} == {"refused"}

    asyncio.run(go())


def test_one_mutating_command_per_node() -> None:
    async def go() -> None:
        async with controller() as (running, stub), agent(running, "n0", lambda c: None) as n0:
            app = running.app
            await fleet_of_five(app)
            first = await stub.Retune(operator_pb2.RetuneRequest(node="n0", profile="gpu-defaults"))
            await until(lambda: len(n0.commands) == 1, "the first apply")
            code, details = await status_of(
                stub.Retune(operator_pb2.RetuneRequest(node="n0", profile="gpu-defaults", dry_run=True))
            )
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert f"already has a mutating command in flight: {first.command_id}" in details
            # no answer in time: needs attention; the late answer is recorded on the next pass
            app.commands.expire(time.time() + 3600)
            await app.tuning.settled()
            rec = app.tuning.recs[first.recommendation_id]
            assert (
                rec.state == "needs_attention"
                and "the outcome is unknown until the agent answers" in rec.detail
            )
            assert app.breaker.state.actions[0].outcome == "failed"
            await n0.reply(first.command_id, committed(n0.commands[0]))
            await until(lambda: app.commands.get(first.command_id).result is not None, "the late answer")  # type: ignore[union-attr]
            await app.tuning.after_pass()
            assert rec.state == "verified" and app.breaker.state.actions[0].outcome == "succeeded"
            entries = await app.store.list_audit(node="n0")  # newest first
            assert [(e.parameters["dry_run"], e.outcome) for e in entries] == [
                (True, "refused"),
                (False, "succeeded"),
            ]

    asyncio.run(go())


def test_an_apply_in_flight_is_settled_after_a_controller_restart(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")

    async def go() -> None:
        async with (
            controller({"power_cap": "auto"}, db=db) as (running, _),
            agent(running, "n0", lambda c: None) as n0,
        ):
            await fleet_of_five(running.app)
            await power_cap(running.app)
            await running.app.tuning.after_pass()
            await until(lambda: len(n0.commands) == 1, "the apply")
            [rec] = rows(running.app)
            assert rec.state == "applying"
        async with controller({"power_cap": "auto"}, db=db) as (running, _):
            [again] = rows(running.app)
            assert (again.id, again.state) == (rec.id, "applying")
            async with agent(running, "n0") as n0:  # the channel sends it again, same id; answered
                await until(lambda: concluded(running.app, "verified"), "the restarted apply")
                assert [c.id for c in n0.commands] == [rec.command_id]
            [action] = running.app.breaker.state.actions  # the slot taken before the restart
            assert action.outcome == "succeeded"

    asyncio.run(go())


def test_an_apply_never_sent_before_a_restart_is_failed(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")

    async def go() -> None:
        async with controller(db=db) as (running, _):
            now = time.time()
            lost = Recommendation(
                "r1", "n0", "power_cap", "tune", "gpu-defaults", "applying", now, now, command_id="c-lost"
            )
            await running.app.store.save_recommendation(lost)
        async with controller(db=db) as (running, _):
            [rec] = rows(running.app)
            assert rec.state == "failed" and "never sent" in rec.detail

    asyncio.run(go())


def test_breaker_config_budget_lets_two_nodes_through() -> None:
    async def go() -> None:
        async with (
            controller({"power_cap": "auto"}, breaker=BreakerConfig(share=0.4)) as (running, _),
            agent(running, "n0") as n0,
            agent(running, "n1") as n1,
        ):
            app = running.app
            await fleet_of_five(app)
            await power_cap(app, "n0")
            await power_cap(app, "n1")
            await app.tuning.after_pass()
            await until(lambda: [r.state for r in rows(app)] == ["verified", "verified"], "both applies")
            assert len(n0.commands) == len(n1.commands) == 1

    asyncio.run(go())
