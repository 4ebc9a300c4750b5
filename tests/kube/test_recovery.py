"""Auto uncordon (controller/kube/recovery.py) after the detection passes of a ControllerApp on the
fake API server: a node the policy drained is uncordoned (audited as the policy's, never counted
by the breaker) only once its findings cleared and a re-probe newer than that has been judged by a
pass; a finding that comes back starts it over; someone else's cordon, an operator's cordon after
the drain, an operator's own drain and a node under someone else's maintenance are left alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.app import ControllerApp
from controller.config import MaintenanceConfig
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import node
from controller.kube.nodes import CORDONED_BY
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import add_findings, stored_finding
from tests.kube.harness import FakeTime, audit, kube, run, web_pods
from tests.kube.test_policy import cordoned, drained, nvlink_down

MAINTENANCE = "example.com/maintenance"


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        for i in range(3):
            s.add(node(f"n{i}"))
        web_pods(s, 1)
        yield s


def clock(app: ControllerApp) -> FakeTime:
    assert isinstance(app.clock, FakeTime)
    return app.clock


async def passes(app: ControllerApp, n: int = 1) -> None:
    """`n` detection passes, 10 s apart (the injected findings clear: no detector raises them)."""
    for _ in range(n):
        clock(app).now += 10
        await app.detection_pass()
        if app.kube_health.task is not None:
            await app.kube_health.task


async def probed(app: ControllerApp, name: str = "n0") -> None:
    """A probe result from the node, measured a second after the last pass."""
    clock(app).now += 1
    seq = max((s for (n, _), s in app.fleet.acked.items() if n == name), default=0) + 1
    frame = pb.TelemetryFrame(node=name, boot_id="b1", seq=seq)
    frame.time.FromNanoseconds(int(clock(app).now * 1e9))
    frame.probes.add(probe="gemm", variant="bf16", gpu=0, value=700.0, unit="TFLOP/s")
    await app.ingest.frame(name, frame)


async def policy_uncordons(app: ControllerApp) -> list[str]:
    return [e.outcome for e in await audit(app, "uncordon") if e.requester == "policy"]


async def drained_by_policy(app: ControllerApp, server: FakeApiServer) -> None:
    await nvlink_down(app, "n0")
    assert (await drained(app, "n0")).state == "verified"
    assert cordoned(server, "n0") == "gpufleet"


def test_uncordoned_once_findings_cleared_and_a_newer_probe_was_judged(
    tmp_path: Path, server: FakeApiServer
) -> None:
    async def body(app: ControllerApp) -> None:
        await drained_by_policy(app, server)
        await probed(app)  # before the findings clear: not a re-probe after the repair
        await app.recovery.after_pass()
        await passes(app, 3)  # the findings clear in the third (detect.close_after_passes clean ones)
        assert app.active == {} and cordoned(server, "n0") == "gpufleet"

        await probed(app)
        await passes(app)  # the pass that judges the re-probe: not yet
        assert cordoned(server, "n0") == "gpufleet"
        await add_findings(app, [stored_finding("n0", None, "nvlink_down", "critical")])
        await app.recovery.after_pass()  # the finding came back: it starts over
        await passes(app, 3)  # ...and clears in the third
        assert cordoned(server, "n0") == "gpufleet"

        await probed(app)
        await passes(app, 2)
        obj = server.get("Node", "n0")
        assert obj is not None and not obj["spec"].get("unschedulable")
        assert CORDONED_BY not in (obj["metadata"].get("annotations") or {})
        [entry] = [e for e in await audit(app, "uncordon")]
        assert (entry.requester, entry.outcome, entry.parameters["is_recovery"]) == (
            "policy",
            "succeeded",
            True,
        )
        assert "back within fleet normal" in entry.reason
        assert [a.kind for a in app.breaker.state.actions] == ["drain"]  # recovery is never counted
        await passes(app, 2)
        assert await policy_uncordons(app) == ["succeeded"]

    run(kube(tmp_path, server, default_policy="auto"), body)


def test_the_node_is_re_probed_when_its_findings_clear_and_a_refused_re_probe_waits_for_the_schedule(
    tmp_path: Path, server: FakeApiServer
) -> None:
    """The pass that sees a drained node's findings clear asks for its re-probe (the schedule's next
    round could be probes.interval_seconds away), once per clear; a finding that comes back starts
    it over. Here the node's agent is not connected, so the real request fails: logged, and the
    next probe result counts as before."""

    async def body(app: ControllerApp) -> None:
        asked: list[tuple[str, float]] = []
        sent = app.recovery.reprobe
        assert sent is not None

        async def reprobe(node: str) -> object:
            asked.append((node, clock(app).now))
            return await sent(node)  # the probing's own: "node n0 is not connected"

        app.recovery.reprobe = reprobe
        await drained_by_policy(app, server)
        await passes(app, 2)
        assert asked == []  # the finding is still active
        await passes(app)  # cleared in the third
        assert app.active == {} and [n for n, _ in asked] == ["n0"]
        cleared_at = asked[0][1]
        await passes(app, 2)
        assert len(asked) == 1  # once per clear
        await add_findings(app, [stored_finding("n0", None, "nvlink_down", "critical")])
        await app.recovery.after_pass()
        await passes(app, 3)
        assert [n for n, _ in asked] == ["n0", "n0"] and asked[1][1] > cleared_at  # the new clear
        assert cordoned(server, "n0") == "gpufleet"
        await probed(app)
        await passes(app, 2)
        assert await policy_uncordons(app) == ["succeeded"]

    run(kube(tmp_path, server, default_policy="auto"), body)


@pytest.mark.parametrize("who", ["someone_else", "operator_cordon_after"])
def test_a_cordon_that_is_not_the_drains_stays(tmp_path: Path, server: FakeApiServer, who: str) -> None:
    async def body(app: ControllerApp) -> None:
        await drained_by_policy(app, server)
        if who == "someone_else":  # uncordoned and cordoned again with kubectl: no annotation
            obj = server.get("Node", "n0")
            assert obj is not None
            obj["metadata"]["annotations"].pop(CORDONED_BY)
            server.replace(obj)
            assert cordoned(server, "n0") == "other"
        else:
            await app.kube.uncordon("n0", requester="operator:t")
            await app.kube.cordon("n0", requester="operator:t", reason="keep it out for now")
            assert cordoned(server, "n0") == "gpufleet"
        await passes(app)
        await probed(app)
        await passes(app, 3)
        assert cordoned(server, "n0") != ""
        assert await policy_uncordons(app) == []

    run(kube(tmp_path, server, default_policy="auto"), body)


def test_an_operators_own_drain_is_the_operators_to_undo(tmp_path: Path, server: FakeApiServer) -> None:
    async def body(app: ControllerApp) -> None:
        await nvlink_down(app, "n0")  # recommend: proposed, not started
        record = await app.kube.drain("n0", requester="operator:t", reason="replace the baseboard")
        await app.kube.wait(record, 30)
        await passes(app)
        await probed(app)
        await passes(app, 3)
        assert cordoned(server, "n0") == "gpufleet" and await audit(app, "uncordon") == []

    run(kube(tmp_path, server), body)


def test_a_node_under_someone_elses_maintenance_waits(tmp_path: Path, server: FakeApiServer) -> None:
    cfg = kube(
        tmp_path, server, default_policy="auto", maintenance=MaintenanceConfig(annotations=[MAINTENANCE])
    )

    async def body(app: ControllerApp) -> None:
        await drained_by_policy(app, server)
        obj = server.get("Node", "n0")
        assert obj is not None
        obj["metadata"]["annotations"][MAINTENANCE] = "ticket-7"
        server.replace(obj)
        await passes(app, 3)  # the findings clear (detect.close_after_passes clean passes)
        await probed(app)
        await passes(app, 3)
        assert cordoned(server, "n0") == "gpufleet" and await audit(app, "uncordon") == []

        obj = server.get("Node", "n0")
        assert obj is not None
        del obj["metadata"]["annotations"][MAINTENANCE]
        server.replace(obj)
        await passes(app)
        assert cordoned(server, "n0") == "" and await policy_uncordons(app) == ["succeeded"]

    run(cfg, body)
