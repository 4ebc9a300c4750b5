"""`gpufleet commands`: the commands the controller sent to agents, newest first.

JSON/YAML: {"commands": [...]}, each with id, node, kind, state (lower case: pending, sent, running,
succeeded, failed, timed_out, cancelled), requester, created/sent/finished/deadline (RFC 3339; null
when not yet), error, result (the agent's CommandResult, null until it answered) and command.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from controller.cli.jsonify import message_to_dict
from controller.cli.layout import Cell, Col, clean, make_table, plain, show
from controller.cli.operator import TIMEOUT_S, OperatorError, call_operator, node_list
from controller.cli.output import DOCUMENT_FORMATS, print_document
from controller.cli.tables import age
from protos.gpufleet.v1 import operator_pb2

STATE_STYLE = {
    "succeeded": "green",
    "failed": "bold red",
    "timed_out": "red",
    "cancelled": "dim",
    "running": "cyan",
}


def state_name(state: int) -> str:
    try:
        return operator_pb2.CommandState.Name(state).removeprefix("COMMAND_STATE_").lower()  # type: ignore[arg-type]
    except ValueError:
        return str(state)  # newer than this CLI


def command_to_dict(info: operator_pb2.CommandInfo) -> dict[str, Any]:
    out: dict[str, Any] = message_to_dict(info)
    out["state"] = state_name(info.state)
    for name in ("sent", "finished", "result"):
        out.setdefault(name, None)  # the same keys in every entry: null when not yet
    return out


def outcome(info: operator_pb2.CommandInfo) -> str:
    """One line: the error, else what the result's payload says."""
    if info.error:
        return info.error
    if not info.HasField("result"):
        return "-"
    result = info.result
    if result.WhichOneof("payload") == "run_probes":
        p = result.run_probes
        text = f"{p.results} results, {p.failed} failed, {p.duration_seconds:.1f}s"
    else:
        text = "ok" if result.ok else "failed"
    return f"{text} (answered from the agent's memory)" if result.repeated else text


def commands_table(commands: Sequence[operator_pb2.CommandInfo], *, wide: bool = False) -> Table:
    columns = (
        Col("ID", key=True),
        Col("NODE", key=True),
        Col("KIND", drop=4),
        Col("STATE"),
        Col("REQUESTER", drop=3),
        Col("CREATED", drop=5),
        Col("SENT", drop=7, wide=True),
        Col("FINISHED", drop=6),
        Col("RESULT", drop=1, wrap=True),
    )
    rows: list[Sequence[Cell]] = []
    for c in commands:
        state = state_name(c.state)
        rows.append(
            (
                c.id,
                c.node,
                c.kind,
                plain(state, style=STATE_STYLE.get(state, "")),
                c.requester,
                age(c.created.seconds),
                age(c.sent.seconds) if c.HasField("sent") else "-",
                age(c.finished.seconds) if c.HasField("finished") else "-",
                outcome(c),
            )
        )
    return make_table("Commands", columns, rows, wide=wide)


def commands(target: str, output: str, node: str = "", limit: int = 0) -> int:
    request = operator_pb2.ListCommandsRequest(node=node, limit=limit)
    try:
        resp = call_operator(
            target, lambda s: node_list(s, node, s.ListCommands(request, timeout=TIMEOUT_S), "commands")
        )
    except OperatorError as exc:
        print(f"gpufleet: {clean(str(exc))}", file=sys.stderr)
        return 1
    if output in DOCUMENT_FORMATS:
        print_document({"commands": [command_to_dict(c) for c in resp.commands]}, output)
    else:
        show(commands_table(resp.commands, wide=output == "wide"))
    return 0
