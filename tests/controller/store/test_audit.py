"""The audit table and the breaker row in a real SQLite file and a real PostgreSQL database: written,
updated in place, listed newest first with node and since filters, and read back by a new Store."""

from __future__ import annotations

import asyncio

import pytest

from controller.store.audit import AuditEntry
from controller.store.store import Store


async def check(db: str) -> None:
    store = Store(db)
    await store.open()
    try:
        for i, node in enumerate(["a", "b", "a"]):
            await store.add_audit(
                AuditEntry(f"e{i}", 100.0 + i, "policy", "retune", node, {"i": i}, "why", ["f"])
            )
        await store.set_audit_outcome("e0", "succeeded", 105.0, "ok")
        with pytest.raises(ValueError, match="outcome"):
            await store.set_audit_outcome("e1", "maybe", 105.0, "")
        with pytest.raises(KeyError):
            await store.set_audit_outcome("missing", "failed", 105.0, "")
        await store.save_breaker('{"tripped": true}', 106.0)
    finally:
        store.close()
    store = Store(db)
    await store.open()
    try:
        assert [e.id for e in await store.list_audit()] == ["e2", "e1", "e0"]
        assert [e.id for e in await store.list_audit(node="a")] == ["e2", "e0"]
        assert [e.id for e in await store.list_audit(since=101.0)] == ["e2", "e1"]
        assert [e.id for e in await store.list_audit(limit=1)] == ["e2"]
        first = await store.get_audit("e0")
        assert first == AuditEntry(
            "e0", 100.0, "policy", "retune", "a", {"i": 0}, "why", ["f"], "succeeded", 105.0, "ok"
        )
        second = await store.get_audit("e1")
        assert second is not None and second.outcome == "requested"
        assert await store.load_breaker() == '{"tripped": true}'
    finally:
        store.close()


def test_audit_rows_and_breaker_state_persist(store_db: str) -> None:
    asyncio.run(check(store_db))
