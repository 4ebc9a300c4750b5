"""The leader lease on both backends (tests/store_backends.py): one store leads, another waits until
it goes and then leads with the next term; a deposed leader's actions are refused in the store."""

from __future__ import annotations

import asyncio

import pytest

from controller.errors import NotLeader
from controller.store.audit import AuditEntry
from controller.store.commands import CommandRecord
from controller.store.leader import begin_term
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.store.test_store import run


def _entry(i: int) -> AuditEntry:
    return AuditEntry(f"e{i}", 100.0 + i, "policy", "retune", "n1", {}, "why", [])


def _command(i: int) -> CommandRecord:
    return CommandRecord(f"c{i}", "n1", "run_probes", "scheduler", 100.0, 200.0, pb.Command(id=f"c{i}"))


def test_one_store_leads_the_other_waits_until_it_closes_then_leads_the_next_term(store_db: str) -> None:
    async def go() -> None:
        first, second = Store(store_db), Store(store_db)
        await first.open()
        await second.open()
        assert await first.lead("first:1", 10.0, lambda: pytest.fail("nothing to wait for"), poll=0.05) == 1
        waits: list[int] = []
        taking = asyncio.create_task(second.lead("second:2", 20.0, lambda: waits.append(1), poll=0.05))
        await asyncio.sleep(0.5)
        assert not taking.done() and waits == [1]  # told once that it waits
        assert await first.still_leading()
        first.close()
        assert await asyncio.wait_for(taking, 10) == 2
        assert await second.still_leading()
        await second.add_audit(_entry(1))
        second.close()

    run(go())


def test_a_deposed_leader_can_neither_audit_nor_command(store_db: str) -> None:
    async def go() -> None:
        leader, other = Store(store_db), Store(store_db)
        await leader.open()
        await other.open()
        assert await leader.lead("old:1", 10.0, lambda: None) == 1
        await leader.add_audit(_entry(0))
        await leader.save_command(_command(0))
        # Another controller's term began (its lease taken after this one's went unnoticed).
        assert await other._thread.call(lambda c: begin_term(c, "new:2", 20.0)) == 2
        with pytest.raises(NotLeader, match=r"term 1 is over: term 2 \(new:2\) leads"):
            await leader.add_audit(_entry(1))
        with pytest.raises(NotLeader):
            await leader.save_command(_command(1))
        assert not await leader.still_leading()
        assert [e.id for e in await other.list_audit()] == ["e0"]
        assert [c.id for c in await other.list_commands()] == ["c0"]
        leader.close()
        other.close()

    run(go())
