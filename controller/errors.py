"""Domain errors; the interceptor maps each to one gRPC status (see interceptors.py)."""

from __future__ import annotations


class ControllerError(Exception):
    """Base of every error the controller reports to a client."""


class InvalidMessage(ControllerError):
    """A message is malformed or contradicts its stream (e.g. a frame for another node)."""


class SequenceGap(ControllerError):
    """A frame arrived ahead of the next expected sequence number; the agent must resend from its spool."""


class NotFound(ControllerError):
    """The named node (or other object) is not known."""


class FailedPrecondition(ControllerError):
    """The request is well formed but the target is not in a state to serve it (e.g. not connected)."""


class StoreUnavailable(ControllerError):
    """The store could not persist (disk full, I/O error); nothing was acked, the agent will retry."""
