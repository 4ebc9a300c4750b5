"""`gpufleet ack`, `silence`, `silences`, `unsilence` and `maintenance`: what operators say about
findings. Each call is audited by the controller (`gpufleet history`).

JSON/YAML: `ack` prints the finding as `findings -o json` does (with its ack); `silence` and
`unsilence` print {"silence": {id, node, cause ("" every cause), starts, ends, by, comment,
active}}; `silences` prints {"silences": [...]} of the same; `maintenance` prints {node, changed,
detail, audit_id}. Exit status: 0 done, 1 refused or no controller, 2 bad arguments here (no
--node or --for, a duration that is not one, maintenance neither on nor off).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from controller.cli.jsonify import finding_to_dict, message_to_dict
from controller.cli.layout import Cell, Col, clean, make_table, plain, show
from controller.cli.operator import TIMEOUT_S, OperatorError, call_operator, node_list
from controller.cli.output import DOCUMENT_FORMATS, add_operator_arguments, print_document
from controller.cli.since import UNITS
from controller.cli.tables import age, cause_name
from protos.gpufleet.v1 import operator_pb2

COMMANDS = ("ack", "silence", "silences", "unsilence", "maintenance")


def add_silence_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ack = sub.add_parser(
        "ack",
        help="acknowledge a finding: seen, being handled (audited; the finding stays active)",
        description="Acknowledge a finding (its id: gpufleet findings -o wide). The ack (who, when, "
        "the comment) is shown on the finding; nothing else changes.",
    )
    ack.add_argument("finding_id", metavar="FINDING_ID", help="the finding's id")
    ack.add_argument("--comment", default="", metavar="TEXT", help="why, or what is being done (audited)")
    add_operator_arguments(ack)

    silence = sub.add_parser(
        "silence",
        help="silence a node's findings (one cause, or all) for a while (audited)",
        description="Silence a node's findings for a while: they stay active and stored, are listed "
        "only with gpufleet findings --all, leave the node's health alone and drive no action "
        "(recommendation, retune, drain). At most 30 days.",
    )
    # --node and --for are required, checked when it runs (one line, exit 2), as `maintenance`'s
    # on|off: every operator command parses with its positional arguments alone.
    silence.add_argument("--node", default="", metavar="NODE", help="the node (required)")
    silence.add_argument(
        "--cause", default="", metavar="CAUSE", help="only this cause (default: every cause)"
    )
    silence.add_argument(
        "--for",
        dest="duration",
        default="",
        metavar="D",
        help="how long (required): 90s, 30m, 2h, 1d (at most 30d)",
    )
    silence.add_argument("--comment", default="", metavar="TEXT", help="why (audited)")
    add_operator_arguments(silence)

    listing = sub.add_parser(
        "silences", help="list silences, newest first (active ones; --all: ended ones too)"
    )
    listing.add_argument("--node", default="", help="only this node")
    listing.add_argument("--all", action="store_true", help="include silences that ended")
    add_operator_arguments(listing)

    unsilence = sub.add_parser("unsilence", help="end a silence now (audited)")
    unsilence.add_argument("id", metavar="ID", help="the silence's id (gpufleet silences)")
    unsilence.add_argument("--comment", default="", metavar="TEXT", help="why (audited)")
    add_operator_arguments(unsilence)

    maintenance = sub.add_parser(
        "maintenance",
        help="put a node under maintenance, or take it out (audited)",
        description="A node under maintenance has its findings silenced, and the controller takes no "
        "action on it (no scheduled probe, retune, drain or uncordon) until it is out again.",
    )
    maintenance.add_argument("node", metavar="NODE", help="the node")
    maintenance.add_argument("state", metavar="on|off", help="on: under maintenance; off: out of it")
    maintenance.add_argument("--comment", default="", metavar="TEXT", help="why (audited)")
    add_operator_arguments(maintenance)


def parse_duration(text: str) -> float:
    """Seconds in 90s, 30m, 2h, 1d, 1w (a bare number: seconds); ValueError otherwise."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw]?)", text.strip())
    if not match or float(match[1]) <= 0:
        raise ValueError(f"--for must be a duration such as 90s, 30m, 2h or 1d, not {text!r}")
    return float(match[1]) * UNITS[match[2] or "s"]


def until(ts_seconds: int, now: float | None = None) -> str:
    """ "in 2h", "in 5m", "in 12s" for a time ahead; "3m ago" for one past."""
    delta = ts_seconds - (time.time() if now is None else now)
    if delta <= 0:
        return age(ts_seconds, now)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"in {delta // size:.0f}{unit}"
    return f"in {delta:.0f}s"


def silences_table(
    silences: Sequence[operator_pb2.SilenceInfo], *, wide: bool = False, empty: str = "none"
) -> Table:
    columns = (
        Col("ID", key=True),
        Col("NODE", key=True),
        Col("CAUSE", key=True),
        Col("STATE"),
        Col("ENDS", drop=3),
        Col("STARTED", drop=4, wide=True),
        Col("BY", drop=2),
        Col("COMMENT", drop=1, wrap=True),
    )
    rows: list[Sequence[Cell]] = [
        (
            s.id,
            s.node,
            s.cause or "(all)",
            plain("active", style="yellow") if s.active else plain("ended", style="dim"),
            until(s.ends.seconds),
            age(s.starts.seconds),
            s.by,
            s.comment or "-",
        )
        for s in silences
    ]
    return make_table("Silences", columns, rows, wide=wide, empty=empty)


def _fail(command: str, exc: OperatorError) -> int:
    print(f"gpufleet {command}: {clean(str(exc))}", file=sys.stderr)
    return 1


def _show_silence(s: operator_pb2.SilenceInfo, output: str) -> None:
    if output in DOCUMENT_FORMATS:
        print_document({"silence": message_to_dict(s)}, output)
    else:
        show(silences_table([s], wide=output == "wide"))


def ack(target: str, finding_id: str, output: str, *, comment: str) -> int:
    request = operator_pb2.AckFindingRequest(finding_id=finding_id, comment=comment)
    try:
        f = call_operator(target, lambda s: s.AckFinding(request, timeout=TIMEOUT_S))
    except OperatorError as exc:
        return _fail("ack", exc)
    if output in DOCUMENT_FORMATS:
        print_document(finding_to_dict(f), output)
    else:
        gpu = f" GPU {f.gpu}" if f.HasField("gpu") else ""
        show(plain(f"finding {f.id} ({f.node}{gpu}, {cause_name(f.cause)}) acked by {f.ack.by}"))
    return 0


def silence(target: str, output: str, *, node: str, cause: str, duration: str, comment: str) -> int:
    if not node or not duration:
        print("gpufleet silence: give --node NODE and --for D (e.g. --for 2h)", file=sys.stderr)
        return 2
    try:
        seconds = parse_duration(duration)
    except ValueError as exc:
        print(f"gpufleet silence: {clean(str(exc))}", file=sys.stderr)
        return 2
    request = operator_pb2.SilenceRequest(node=node, cause=cause, duration_seconds=seconds, comment=comment)
    try:
        info = call_operator(target, lambda s: s.Silence(request, timeout=TIMEOUT_S))
    except OperatorError as exc:
        return _fail("silence", exc)
    _show_silence(info, output)
    return 0


def silences(target: str, output: str, *, node: str, include_expired: bool) -> int:
    request = operator_pb2.ListSilencesRequest(node=node, include_expired=include_expired)
    try:
        resp = call_operator(
            target, lambda s: node_list(s, node, s.ListSilences(request, timeout=TIMEOUT_S), "silences")
        )
    except OperatorError as exc:
        return _fail("silences", exc)
    if output in DOCUMENT_FORMATS:
        print_document({"silences": [message_to_dict(s) for s in resp.silences]}, output)
    else:
        empty = "none" if include_expired else "none active (--all shows ended ones too)"
        show(silences_table(resp.silences, wide=output == "wide", empty=empty))
    return 0


def unsilence(target: str, silence_id: str, output: str, *, comment: str) -> int:
    request = operator_pb2.UnsilenceRequest(id=silence_id, comment=comment)
    try:
        info = call_operator(target, lambda s: s.Unsilence(request, timeout=TIMEOUT_S))
    except OperatorError as exc:
        return _fail("unsilence", exc)
    _show_silence(info, output)
    return 0


def maintenance(target: str, node: str, on: bool, output: str, *, comment: str) -> int:
    request = operator_pb2.SetMaintenanceRequest(node=node, on=on, comment=comment)
    try:
        resp = call_operator(target, lambda s: s.SetMaintenance(request, timeout=TIMEOUT_S))
    except OperatorError as exc:
        return _fail("maintenance", exc)
    if output in DOCUMENT_FORMATS:
        print_document(message_to_dict(resp), output)
    else:
        show(plain(resp.detail, style="" if resp.changed else "dim"))
    return 0


def run(args: Any) -> int:
    """Dispatch one of COMMANDS (args from the `gpufleet` parser, credentials resolved)."""
    if args.command == "ack":
        return ack(args.controller, args.finding_id, args.output, comment=args.comment)
    if args.command == "silence":
        return silence(
            args.controller,
            args.output,
            node=args.node,
            cause=args.cause,
            duration=args.duration,
            comment=args.comment,
        )
    if args.command == "silences":
        return silences(args.controller, args.output, node=args.node, include_expired=args.all)
    if args.command == "unsilence":
        return unsilence(args.controller, args.id, args.output, comment=args.comment)
    if args.state not in ("on", "off"):
        print(f"gpufleet maintenance: say on or off, not {clean(args.state)!r}", file=sys.stderr)
        return 2
    return maintenance(args.controller, args.node, args.state == "on", args.output, comment=args.comment)
