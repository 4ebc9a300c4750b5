"""The breaker as the controller holds it (app.breaker) over a real SQLite file: the live fleet's
peer groups, audit entries written before deciding and before acting, the state kept across a
controller restart, and an audited reset."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from controller.app import ControllerApp
from controller.fleet.peers import group_sizes, node_group
from tests.controller.harness import H100, Clock, config, frame, hello


async def started(db: Path, clock: Clock) -> ControllerApp:
    app = ControllerApp(config(db=str(db)), clock=clock)
    await app.start()
    return app


async def fleet_of(app: ControllerApp, nodes: int, gpus: int = 8, prefix: str = "n") -> None:
    for i in range(nodes):
        name = f"{prefix}{i:02d}"
        await app.ingest.hello(hello(name, gpus=gpus))
        await app.ingest.frame(name, frame(1, name, t=app.clock()))
        app.connected(name)


def audit_rows(db: Path) -> list[tuple[str, str, str, str]]:
    with sqlite3.connect(db) as conn:
        return list(conn.execute("SELECT action, node, outcome, requester FROM audit ORDER BY time, rowid"))


async def check_peer_groups_are_the_detectors_model_and_gpu_count(tmp_path: Path) -> None:
    clock = Clock()
    app = await started(tmp_path / "c.db", clock)
    try:
        await fleet_of(app, 3, gpus=8)
        await fleet_of(app, 2, gpus=4, prefix="small")
        assert node_group(app.fleet.nodes["n00"]) == f"{H100} x8"
        assert group_sizes(app.fleet) == {f"{H100} x8": 3, f"{H100} x4": 2}
    finally:
        app.close()


async def check_state_survives_a_restart_and_reset_is_audited(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    clock = Clock()
    app = await started(db, clock)
    try:
        await fleet_of(app, 10)
        first = await app.breaker.request("retune", "n00", "policy", "power_cap", findings=["f1"])
        assert first.allowed
        refused = await app.breaker.request("retune", "n01", "operator:alice", "clocks low")
        assert not refused.allowed and app.breaker.state.tripped
        await app.breaker.finished(first, "failed", "re-probe still slow")
    finally:
        app.close()

    clock.now += 5 * 3600  # the window emptied while the controller was down
    app = await started(db, clock)
    try:
        for name in list(app.fleet.nodes):  # the agents reconnect
            app.connected(name)
        status = app.breaker.status()
        assert status.state.tripped and "n01 refused" in status.state.why
        again = await app.breaker.request("drain", "n02", "scheduler", "xid 79")
        assert not again.allowed and "reset" in again.why
        recovery = await app.breaker.request("rollback", "n00", "policy", is_recovery=True)
        assert recovery.allowed
        entry = await app.breaker.reset("operator:ipv4:127.0.0.1:5", "checked n00, n01: bad cable")
        assert not app.breaker.state.tripped
        assert (await app.breaker.request("retune", "n02", "policy")).allowed
    finally:
        app.close()

    app = await started(db, clock)  # re-armed stays re-armed, with its new window
    try:
        assert not app.breaker.state.tripped and [a.node for a in app.breaker.state.actions] == ["n02"]
        stored = await app.store.get_audit(entry.id)
        assert stored is not None and stored.reason == "checked n00, n01: bad cable"
        assert stored.parameters["was_tripped"] is True and stored.outcome == "succeeded"
    finally:
        app.close()

    assert audit_rows(db) == [
        ("retune", "n00", "failed", "policy"),
        ("retune", "n01", "refused", "operator:alice"),
        ("drain", "n02", "refused", "scheduler"),
        ("rollback", "n00", "allowed", "policy"),
        ("breaker_reset", "", "succeeded", "operator:ipv4:127.0.0.1:5"),
        ("retune", "n02", "allowed", "policy"),
    ]
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT findings, reason, detail FROM audit WHERE node = 'n00' AND action = 'retune'"
        )
        findings, reason, detail = row.fetchone()
    assert (json.loads(findings), reason, detail) == (["f1"], "power_cap", "re-probe still slow")


async def check_the_audit_entry_is_stored_before_the_action_runs(tmp_path: Path) -> None:
    """A fake action that looks for its own audit row in the SQLite file (another connection) when it runs."""
    db = tmp_path / "c.db"
    app = await started(db, Clock())
    try:
        await fleet_of(app, 10)
        seen: list[tuple[str, str]] = []

        def act(node: str) -> None:
            with sqlite3.connect(db) as conn:
                seen.extend(conn.execute("SELECT node, outcome FROM audit WHERE node = ?", (node,)))

        verdict = await app.breaker.request("retune", "n03", "policy", "test")
        if verdict.allowed:
            act("n03")
        await app.breaker.finished(verdict, "succeeded")
        assert seen == [("n03", "allowed")]

        entry = await app.audit.begin("operator:bob", "drain", "n04", parameters={"force": True})
        act("n04")
        assert seen[-1] == ("n04", "requested")
        await app.audit.outcome(entry, "failed", "no such node")
    finally:
        app.close()


async def check_joining_nodes_do_not_count_and_silent_ones_do(tmp_path: Path) -> None:
    clock = Clock()
    app = await started(tmp_path / "c.db", clock)
    try:
        await fleet_of(app, 10)
        unknown = await app.breaker.request("retune", "joining-node", "policy")
        assert unknown.allowed and not app.breaker.state.actions
        app.disconnected("n05")
        clock.now += app.config.stale_after_seconds + 1
        for name in app.fleet.nodes:
            if name != "n05":
                app.fleet.nodes[name].last_seen = clock.now
        # A silent node is no way around the breaker: its action counts (budget 1 of 10).
        silent = await app.breaker.request("retune", "n05", "policy")
        assert silent.allowed and [a.node for a in app.breaker.state.actions] == ["n05"]
        assert not (await app.breaker.request("retune", "n06", "policy")).allowed
    finally:
        app.close()


def test_peer_groups_are_the_detectors_model_and_gpu_count(tmp_path: Path) -> None:
    asyncio.run(check_peer_groups_are_the_detectors_model_and_gpu_count(tmp_path))


def test_state_survives_a_restart_and_reset_is_audited(tmp_path: Path) -> None:
    asyncio.run(check_state_survives_a_restart_and_reset_is_audited(tmp_path))


def test_the_audit_entry_is_stored_before_the_action_runs(tmp_path: Path) -> None:
    asyncio.run(check_the_audit_entry_is_stored_before_the_action_runs(tmp_path))


def test_joining_nodes_do_not_count_and_silent_ones_do(tmp_path: Path) -> None:
    asyncio.run(check_joining_nodes_do_not_count_and_silent_ones_do(tmp_path))
