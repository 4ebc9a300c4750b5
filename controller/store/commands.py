"""Commands sent to agents, as stored: one row per command id, rewritten on every state change.

The functions run in the store thread (see writer.py); Store in sqlite.py is their async face.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from controller.store.rows import newest_rows
from controller.store.sql import Conn, placeholders, upsert
from protos.gpufleet.v1 import telemetry_pb2 as pb

OPEN_STATES = ("pending", "sent", "running")
FINAL_STATES = ("succeeded", "failed", "timed_out", "cancelled")
STATES = OPEN_STATES + FINAL_STATES


@dataclass(slots=True)
class CommandRecord:
    id: str
    node: str
    kind: str
    requester: str
    created: float
    deadline: float
    command: pb.Command
    state: str = "pending"
    sent: float | None = None
    finished: float | None = None
    boot_id: str = ""  # the agent boot it was last sent to
    error: str = ""
    result: pb.CommandResult | None = None
    failure: str = ""  # not stored: how this controller saw it fail (error, timeout, restarted)

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES


COLUMNS = (
    "id, node, kind, requester, state, created, sent, finished, deadline, boot_id, error, command, result"
)


# A finished command's row never goes back to open: with replica_ingest two controllers write a
# command's row (its issuer, the replica that sends it), and a state one of them sent before the
# other finished it may commit after (a late answer still replaces a finished state).
SAVE = upsert("commands", COLUMNS, "id") + " WHERE commands.finished IS NULL OR excluded.finished IS NOT NULL"
# The issuer's own end of a command another replica sends (timed out there): written only over an
# open row, so an answer that replica stored first stands.
SAVE_IF_OPEN = upsert("commands", COLUMNS, "id") + " WHERE commands.finished IS NULL"


def save_command(conn: Conn, r: CommandRecord, *, if_open: bool = False) -> None:
    conn.execute(
        SAVE_IF_OPEN if if_open else SAVE,
        (
            r.id,
            r.node,
            r.kind,
            r.requester,
            r.state,
            r.created,
            r.sent,
            r.finished,
            r.deadline,
            r.boot_id,
            r.error,
            r.command.SerializeToString(),
            None if r.result is None else r.result.SerializeToString(),
        ),
    )


def _record(row: tuple[object, ...]) -> CommandRecord:
    cid, node, kind, requester, state, created, sent, finished, deadline, boot_id, error, command, result = (
        row
    )
    assert isinstance(command, bytes) and (result is None or isinstance(result, bytes))
    return CommandRecord(
        id=str(cid),
        node=str(node),
        kind=str(kind),
        requester=str(requester),
        state=str(state),
        created=float(created),  # type: ignore[arg-type]
        sent=None if sent is None else float(sent),  # type: ignore[arg-type]
        finished=None if finished is None else float(finished),  # type: ignore[arg-type]
        deadline=float(deadline),  # type: ignore[arg-type]
        boot_id=str(boot_id),
        error=str(error),
        command=pb.Command.FromString(command),
        result=None if result is None else pb.CommandResult.FromString(result),
    )


def list_commands(conn: Conn, node: str, limit: int) -> list[CommandRecord]:
    """Newest first, optionally one node's."""
    return [_record(row) for row in newest_rows(conn, "commands", COLUMNS, "created", node=node, limit=limit)]


def open_commands(conn: Conn) -> list[CommandRecord]:
    """Commands not finished, oldest first: what a restarted controller still owes its nodes."""
    rows = conn.execute(f"SELECT {COLUMNS} FROM commands WHERE finished IS NULL ORDER BY created, id")
    return [_record(row) for row in rows]


IDS_PER_QUERY = 500


def _chunks(values: Sequence[str]) -> Iterator[tuple[str, ...]]:
    for start in range(0, len(values), IDS_PER_QUERY):
        yield tuple(values[start : start + IDS_PER_QUERY])


def open_commands_of(conn: Conn, nodes: Sequence[str]) -> list[CommandRecord]:
    """These nodes' unfinished commands, oldest first (replica_ingest: the ones to send)."""
    records = []
    for chunk in _chunks(nodes):
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM commands WHERE finished IS NULL AND node IN ({placeholders(chunk)})",
            chunk,
        )
        records += [_record(row) for row in rows]
    return sorted(records, key=lambda r: (r.created, r.id))


def commands_by_id(conn: Conn, ids: Sequence[str]) -> list[CommandRecord]:
    """These commands as stored (replica_ingest: how another replica's sending of them went)."""
    records = []
    for chunk in _chunks(ids):
        rows = conn.execute(f"SELECT {COLUMNS} FROM commands WHERE id IN ({placeholders(chunk)})", chunk)
        records += [_record(row) for row in rows]
    return records


def unanswered_commands(conn: Conn) -> list[CommandRecord]:
    """Commands that timed out with no answer, oldest first: a mutating one still holds its node
    until the agent answers or restarts (controller/commands/channel.py)."""
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM commands WHERE state = 'timed_out' AND result IS NULL ORDER BY created, id"
    )
    return [_record(row) for row in rows]


def load_commands(conn: Conn) -> tuple[list[CommandRecord], list[CommandRecord]]:
    return open_commands(conn), unanswered_commands(conn)


def prune_commands(conn: Conn, before: float) -> int:
    return conn.execute(
        "DELETE FROM commands WHERE finished IS NOT NULL AND finished < ?", (before,)
    ).rowcount
