"""The recommendations table in a real SQLite file: a row round-trips whole (changes, targets, the
agent's answer), is rewritten in place, listed newest first per node, deleted, pruned when
finished and old, and created in a store file from before the table existed."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from controller.store.recommendations import Change, Recommendation
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb


def row(rid: str, node: str, created: float, state: str = "proposed") -> Recommendation:
    return Recommendation(
        id=rid,
        node=node,
        cause="power_cap",
        action="tune",
        profile="gpu-defaults",
        state=state,
        created=created,
        updated=created,
        policy="recommend",
        risk="online",
        finding_ids=["f1", "f2"],
        gpus=[1, 3],
        changes=[Change("gpu[1].power_limit", "300 W", "default (700 W)")],
        targets={"gpu": {"power_limit": "default"}},
        expected_effect="restore it",
    )


async def check(db: str) -> None:
    store = Store(db)
    await store.open()
    try:
        for i, node in enumerate(["a", "b", "a"]):
            await store.save_recommendation(row(f"r{i}", node, 100.0 + i))
        applied = row("r0", "a", 100.0, state="verified")
        applied.command_id, applied.breaker_action, applied.audit_id = "c1", "b1", "e1"
        applied.updated = 110.0
        applied.result = pb.ApplyProfileResult(
            state="committed",
            changes=[pb.SettingChange(setting="gpu[1].power_limit", current="300", target="700")],
        )
        await store.save_recommendation(applied)  # in place
        await store.save_recommendation(row("gone", "c", 90.0))
        await store.delete_recommendation("gone")
    finally:
        store.close()
    store = Store(db)
    await store.open()
    try:
        assert [r.id for r in await store.list_recommendations()] == ["r2", "r1", "r0"]
        assert [r.id for r in await store.list_recommendations(node="a")] == ["r2", "r0"]
        assert [r.id for r in await store.list_recommendations(limit=1)] == ["r2"]
        assert [r.id for r in await store.load_recommendations()] == ["r0", "r1", "r2"]  # oldest first
        [back] = [r for r in await store.load_recommendations() if r.id == "r0"]
        assert back == applied
        assert back.changes[0] == Change("gpu[1].power_limit", "300 W", "default (700 W)", False)
        assert back.result is not None and back.result.changes[0].target == "700"
        assert not back.open and (await store.list_recommendations(node="b"))[0].open
        assert await store.prune_history(105.0) == 0  # r0 finished at 110: kept
        assert await store.prune_history(111.0) == 1  # now gone; the open ones stay, however old
        assert [r.id for r in await store.load_recommendations()] == ["r1", "r2"]
    finally:
        store.close()


def test_recommendation_rows_persist_update_and_prune(store_db: str) -> None:
    asyncio.run(check(store_db))


def test_a_store_file_from_before_the_table_gets_it(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:  # a version-1 file written before recommendations existed
        conn.execute(
            "CREATE TABLE nodes (name TEXT PRIMARY KEY, hello BLOB, first_seen REAL, last_seen REAL)"
        )
        conn.execute("PRAGMA user_version=1")

    async def go() -> None:
        store = Store(str(db))
        await store.open()
        try:
            await store.save_recommendation(row("r0", "a", 1.0))
            assert [r.id for r in await store.list_recommendations()] == ["r0"]
        finally:
            store.close()

    asyncio.run(go())
