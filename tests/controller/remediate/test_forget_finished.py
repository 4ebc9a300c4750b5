"""The hourly prune drops finished recommendations from the controller's memory as it drops them
from the store: before, a long-running controller kept every row it ever finished (each pass walked
them all), and only a restart, loading what the store still had, let them go."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.app import PROBE_HISTORY_DAYS, ControllerApp
from controller.store.recommendations import Recommendation
from tests.controller.harness import Clock, config
from tests.controller.store.test_recommendations import row as stored_row

DAY = 86400.0


def row(rec_id: str, state: str, updated: float, command_id: str = "") -> Recommendation:
    rec = stored_row(rec_id, "n0", updated, state)
    rec.command_id = command_id
    return rec


async def check_old_finished_rows_leave_memory_with_the_store(tmp_path: Path) -> None:
    clock = Clock()
    app = ControllerApp(config(db=str(tmp_path / "c.db")), clock=clock)
    await app.start()
    try:
        now = clock()
        old = now - (PROBE_HISTORY_DAYS + 1) * DAY
        rows = [
            row("old-verified", "verified", old, command_id="c1"),
            row("old-attention", "needs_attention", old, command_id="c2"),
            row("old-proposed", "proposed", old),  # open: stays however old
            row("new-rolled-back", "rolled_back", now - DAY, command_id="c3"),
        ]
        for rec in rows:
            app.tuning.recs[rec.id] = rec
            if rec.command_id:
                app.tuning._by_command[rec.command_id] = rec.id
            await app.store.save_recommendation(rec)

        await app._prune(now - PROBE_HISTORY_DAYS * DAY)

        kept = {"old-proposed", "new-rolled-back"}
        assert set(app.tuning.recs) == kept
        assert app.tuning._by_command == {"c3": "new-rolled-back"}
        assert {r.id for r in await app.store.list_recommendations(limit=100)} == kept  # memory == store
    finally:
        app.close()


def test_old_finished_rows_leave_memory_with_the_store(tmp_path: Path) -> None:
    asyncio.run(check_old_finished_rows_leave_memory_with_the_store(tmp_path))
