"""Domain errors; the interceptor maps each to one gRPC status (see interceptors.py)."""

from __future__ import annotations


class ControllerError(Exception):
    """Base of every error the controller reports to a client."""


class InvalidMessage(ControllerError):
    """A message is malformed or contradicts its stream (e.g. a frame for another node)."""


class RefusedFrame(InvalidMessage):
    """One frame is refused for good (INVALID_ARGUMENT): resending it can never succeed. The status
    names it (trailing metadata, protos/refusal.py) so that the agent sets it aside and goes on."""

    def __init__(self, message: str, boot_id: str, seq: int) -> None:
        super().__init__(message)
        self.boot_id = boot_id
        self.seq = seq


class SequenceGap(ControllerError):
    """A frame arrived ahead of the next expected sequence number; the agent must resend from its spool."""


class NotFound(ControllerError):
    """The named node (or other object) is not known."""


class FailedPrecondition(ControllerError):
    """The request is well formed but the target is not in a state to serve it (e.g. not connected)."""


class ResourceExhausted(ControllerError):
    """A configured limit is reached (e.g. limits.max_nodes): refused until something is freed."""


class StoreUnavailable(ControllerError):
    """The store could not persist (disk full, I/O error); nothing was acked, the agent will retry."""


class NotLeader(StoreUnavailable):
    """This controller's term as leader is over (controller/store/lease.py): it may not act."""


class RowBusy(StoreUnavailable):
    """A row this job needs stayed locked by another transaction past the job's short wait (a
    claim on PostgreSQL: controller/store/store.py claim_node retries it)."""


class NotOwner(StoreUnavailable):
    """Another replica ingests the node now (controller/store/owners.py): this one may not write it.
    The stream ends (ABORTED); the agent's next stream goes wherever its Service sends it."""

    def __init__(self, node: str, owner: str | None) -> None:
        now = "no replica" if owner is None else f"replica {owner}"
        super().__init__(f"node {node} is ingested by {now} now (it connected there)")
        self.node = node
        self.owner = owner
