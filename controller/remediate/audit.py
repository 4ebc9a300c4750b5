"""Writing the audit log: an entry committed before anything acts, then its outcome (see
controller/store/audit.py for the row). Each is also one line of the controller's log (logger
gpufleet.controller.audit, INFO), for a site that ships its logs to where audits are kept: the
request once it is stored, then its outcome, both led by the entry's id. The log's rate limit
(protos/logsafe.py) never holds one back."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from controller.store.audit import AuditEntry
from controller.store.store import Store
from protos.logsafe import KEEP

log = logging.getLogger("gpufleet.controller.audit")


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
        log.info(
            "audit %s: %s requested %s%s, reason %s, parameters %s%s",
            entry.id,
            requester,
            action,
            f" on {node}" if node else "",
            json.dumps(reason),
            json.dumps(entry.parameters, sort_keys=True, default=str),
            f", findings {','.join(entry.findings)}" if entry.findings else "",
            extra=KEEP,
        )
        return entry

    async def outcome(self, entry: AuditEntry, outcome: str, detail: str = "") -> None:
        """allowed, refused, succeeded, failed or rolled_back, with why (or the error, the command id)."""
        now = self.clock()
        await self.store.set_audit_outcome(entry.id, outcome, now, detail)
        entry.outcome, entry.outcome_time, entry.detail = outcome, now, detail
        log.info(
            "audit %s: %s%s %s%s",
            entry.id,
            entry.action,
            f" on {entry.node}" if entry.node else "",
            outcome,
            f": {detail}" if detail else "",
            extra=KEEP,
        )
