"""Writing the audit log: an entry committed before anything acts, then its outcome (see
controller/store/audit.py for the row)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from controller.store.audit import AuditEntry
from controller.store.store import Store


class Auditor:
    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock

    async def begin(
        self,
        requester: str,
        action: str,
        node: str = "",
        *,
        parameters: dict[str, Any] | None = None,
        reason: str = "",
        findings: Sequence[str] = (),
    ) -> AuditEntry:
        """Write the request (outcome `requested`); returns once it is stored, so act only after."""
        entry = AuditEntry(
            id=uuid.uuid4().hex[:16],
            time=self.clock(),
            requester=requester,
            action=action,
            node=node,
            parameters=dict(parameters or {}),
            reason=reason,
            findings=list(findings),
        )
        await self.store.add_audit(entry)
        return entry

    async def outcome(self, entry: AuditEntry, outcome: str, detail: str = "") -> None:
        """allowed, refused, succeeded, failed or rolled_back, with why (or the error, the command id)."""
        now = self.clock()
        await self.store.set_audit_outcome(entry.id, outcome, now, detail)
        entry.outcome, entry.outcome_time, entry.detail = outcome, now, detail
