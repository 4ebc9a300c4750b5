"""Every audit entry is also a line of the controller's log (gpufleet.controller.audit): the request
once stored, then its outcome, led by the entry's id, for a site that ships logs to where audits are
kept; the log's rate limit never holds one back."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from controller.app import ControllerApp
from protos.logsafe import SuppressedCounts, configure_logging
from tests.controller.harness import Clock, config, frame, hello

AUDIT = "gpufleet.controller.audit"


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.asynccontextmanager
async def audited(tmp_path: Path, handler: logging.Handler) -> AsyncIterator[ControllerApp]:
    """A started app whose audit lines reach `handler` (and only for the block)."""
    logger = logging.getLogger(AUDIT)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    app = ControllerApp(config(db=str(tmp_path / "c.db")), clock=Clock())
    await app.start()
    try:
        yield app
    finally:
        app.close()
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


async def fleet_of(app: ControllerApp, nodes: int) -> None:
    for i in range(nodes):
        name = f"n{i:02d}"
        await app.ingest.hello(hello(name, gpus=8))
        await app.ingest.frame(name, frame(1, name, t=app.clock()))
        app.connected(name)


async def check_each_entry_is_a_line_when_stored_and_another_with_its_outcome(tmp_path: Path) -> None:
    handler = Lines()
    async with audited(tmp_path, handler) as app:
        await fleet_of(app, 10)
        allowed = await app.breaker.request(
            "retune", "n00", "operator:alice", "clocks low", parameters={"profile": "p1"}, findings=["f1"]
        )
        await app.breaker.finished(allowed, "rolled_back", "re-probe still slow")
        refused = await app.breaker.request("drain", "n01", "policy", "xid 79")
        entry = allowed.audit.id
        assert handler.lines[:3] == [
            f'audit {entry}: operator:alice requested retune on n00, reason "clocks low", '
            'parameters {"is_recovery": false, "profile": "p1"}, findings f1',
            f"audit {entry}: retune on n00 allowed: within budget",
            f"audit {entry}: retune on n00 rolled_back: re-probe still slow",
        ]
        assert handler.lines[3].startswith(f"audit {refused.audit.id}: policy requested drain on n01")
        refusal = f"audit {refused.audit.id}: drain on n01 refused: drain on n01 refused: 1 of 1 nodes"
        assert handler.lines[4].startswith(refusal)
        # The stored entry says the same.
        stored = await app.store.get_audit(entry)
        assert stored is not None
        assert (stored.outcome, stored.detail) == ("rolled_back", "re-probe still slow")


def test_each_entry_is_a_line_when_stored_and_another_with_its_outcome(tmp_path: Path) -> None:
    asyncio.run(check_each_entry_is_a_line_when_stored_and_another_with_its_outcome(tmp_path))


async def check_the_rate_limit_never_holds_an_audit_line_back(tmp_path: Path) -> None:
    # The controller's own handler, at its tightest: one line per key a minute, one key in flight.
    out = io.StringIO()
    handler = configure_logging("info", stream=out, per_window=1, max_keys=1, counts=SuppressedCounts())
    async with audited(tmp_path, handler) as app:
        for i in range(5):
            entry = await app.audit.begin("operator:alice", "probe_node", f"n{i}")
            await app.audit.outcome(entry, "succeeded", "command c1")
        lines = out.getvalue().splitlines()
        assert len([line for line in lines if " audit " in line or ": audit " in line]) == 10
        assert "suppressed" not in out.getvalue()


def test_the_rate_limit_never_holds_an_audit_line_back(tmp_path: Path) -> None:
    asyncio.run(check_the_rate_limit_never_holds_an_audit_line_back(tmp_path))
