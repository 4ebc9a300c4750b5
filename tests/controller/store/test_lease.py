"""The leader lease on both backends (tests/store_backends.py): one store leads, another waits until
it goes and then leads with the next term; a deposed leader's actions are refused in the store."""

from __future__ import annotations

import asyncio

import pytest

from controller.errors import NotLeader
from controller.store import postgres_lease
from controller.store.audit import AuditEntry
from controller.store.commands import CommandRecord
from controller.store.leader import begin_term
from controller.store.lease_keeper import LeaseKeeper
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.store.test_store import run
from tests.postgres_server import PostgresServer


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


def test_a_won_lease_is_checked_before_the_server_checks_it_and_keeps_its_postgresql_session(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new leader loads and catches up before the server's own checks begin (15 s and more at
    thousands of nodes): the lease is checked from the moment it is won, so PostgreSQL does not end
    its silent session (idle_session_timeout, here 1 s) and the leader does not lose the lead to it."""
    monkeypatch.setattr(postgres_lease, "SILENCE_SECONDS", 1)
    url = postgres_server.new_database()

    async def go() -> None:
        leader, standby = Store(url), Store(url)
        await leader.open()
        await standby.open()
        assert await leader.lead("leader:1", 10.0, lambda: None, poll=0.2) == 1
        await asyncio.sleep(2.5)  # the load: nobody asks still_leading meanwhile
        assert await leader.still_leading()
        taking = asyncio.create_task(standby.lead("standby:2", 20.0, lambda: None, poll=0.1))
        await asyncio.sleep(1.0)
        assert not taking.done()  # the lock is still the leader's
        leader.close()
        assert await asyncio.wait_for(taking, 10) == 2
        standby.close()

    run(go())


class CountingLease:
    def __init__(self, alive_for: int) -> None:
        self.alive_for = alive_for  # checks answered True, then False
        self.checks = 0
        self.released = False

    def try_acquire(self) -> bool:
        return True

    def alive(self) -> bool:
        self.checks += 1
        return self.checks <= self.alive_for

    def release(self) -> None:
        self.released = True


def test_the_keeper_checks_every_poll_stops_at_a_loss_and_when_stopped() -> None:
    async def go() -> None:
        lease = CountingLease(alive_for=3)
        keeper = LeaseKeeper(lease, poll=0.05)
        keeper.start()
        await asyncio.sleep(0.5)
        assert lease.checks == 4  # three answered alive, the fourth lost it: no check after
        assert not await keeper.alive() and lease.checks == 4  # lost stays lost, unasked
        keeper.stop()
        assert lease.released

        lease = CountingLease(alive_for=1000)
        keeper = LeaseKeeper(lease, poll=0.05)
        keeper.start()
        for _ in range(5):  # the server's checks in between count: the keeper adds none meanwhile
            await asyncio.sleep(0.02)
            assert await keeper.alive()
        assert lease.checks == 5
        await asyncio.sleep(0.3)
        assert 5 + 3 <= lease.checks <= 5 + 8
        keeper.stop()
        stopped_at = lease.checks
        await asyncio.sleep(0.2)
        assert lease.checks == stopped_at and lease.released
        assert not await keeper.alive()

    run(go())
