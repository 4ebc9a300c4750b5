"""`gpufleet retune NODE --profile P` and `gpufleet approve REC_ID`: apply a tuning profile to a node
(or a proposed recommendation) through the controller, and show how it went.

The controller audits the request, asks the blast-radius breaker, and sends the node's agent an
ApplyProfile command; the agent applies all or nothing, re-probes and commits or rolls back.
`retune` asks for confirmation on a terminal unless --yes (off a terminal --yes is required);
--dry-run asks the agent for its plan and changes nothing.

JSON/YAML: the controller's answer: {command_id, audit_id, recommendation_id, done, error, result}
(result: the agent's ApplyProfileResult {state, changes, problems, checks, op_id, left}, null until
it answered). Exit status: 0 committed, planned or nothing to do (or sent, with --no-wait); 1 rolled
back, failed, needs attention, no answer in time, the breaker refused it, or no controller; 2 bad
arguments, unknown node, profile or recommendation, or a node that cannot take it now.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import grpc
from rich.table import Table
from rich.text import Text

from controller.cli.jsonify import message_to_dict
from controller.cli.layout import Col, clean, make_table, plain, show
from controller.cli.operator import OperatorError, call_operator
from controller.cli.output import DOCUMENT_FORMATS, print_document
from controller.cli.waiting import waited
from protos.gpufleet.v1 import operator_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

USAGE_ERRORS = (
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
)
OK_STATES = ("committed", "planned", "nothing_to_do")
RPC_MARGIN_S = 10.0  # the RPC's deadline beyond the wait the controller is asked for
STATE_STYLE = {"committed": "green", "planned": "cyan", "nothing_to_do": "green", "rolled_back": "yellow"}


def response_to_dict(resp: operator_pb2.RetuneResponse) -> dict[str, Any]:
    out: dict[str, Any] = message_to_dict(resp)
    out.setdefault("result", None)
    return out


def changes_table(result: pb.ApplyProfileResult, *, wide: bool = False) -> Table:
    columns = (Col("SETTING", key=True), Col("CURRENT"), Col("TARGET"), Col("AT REBOOT", drop=1))
    rows = [(c.setting, c.current, c.target, "yes" if c.pending_reboot else "-") for c in result.changes]
    return make_table("Changes", columns, rows, wide=wide)


def checks_table(result: pb.ApplyProfileResult, *, wide: bool = False) -> Table:
    columns = (
        Col("PROBE", key=True),
        Col("GPU", key=True),
        Col("VALUE"),
        Col("NORMAL"),
        Col("BEFORE", drop=1),
        Col("PASSED"),
        Col("ERROR", drop=2, wrap=True),
    )
    rows = [
        (
            f"{c.probe} {c.variant}",
            str(c.gpu) if c.HasField("gpu") else "-",
            f"{c.value:.4g}" if not c.error else "-",
            f"{c.normal:.4g}",
            f"{c.before:.4g}",
            Text("yes", style="green") if c.passed else Text("no", style="red"),
            c.error or "-",
        )
        for c in result.checks
    ]
    return make_table("Re-probe", columns, rows, wide=wide)


def _show(what: str, resp: operator_pb2.RetuneResponse, output: str, wait: bool) -> None:
    if output in DOCUMENT_FORMATS:
        print_document(response_to_dict(resp), output)
        return
    if not resp.done:
        if not wait:
            print(clean(f"{what}: command {resp.command_id} sent (audit {resp.audit_id})"))
        return
    if not resp.HasField("result"):  # a drain recommendation: the drain's outcome
        outcome = resp.error or "drained"
        show(plain(f"{what}: {outcome} (drain {resp.command_id})", "red" if resp.error else "green"))
        return
    result = resp.result
    headline = plain(
        f"{what}: {result.state} (command {resp.command_id})", STATE_STYLE.get(result.state, "red")
    )
    parts: list[Any] = [headline]
    wide = output == "wide"
    if result.changes:
        parts.append(changes_table(result, wide=wide))
    if result.checks:
        parts.append(checks_table(result, wide=wide))
    parts += [plain(f"problem: {p}") for p in result.problems]
    if result.left:
        parts.append(plain(f"not back at the snapshot: {', '.join(result.left)}", style="bold red"))
    show(*parts)


def _call(target: str, message: Any, *, rpc: str, what: str, output: str, wait: bool, timeout: float) -> int:
    """Send `message` to the Operator's `rpc` (Retune or Approve), show the answer, return the status."""
    command = rpc.lower()
    deadline = (timeout if wait else 0.0) + RPC_MARGIN_S
    try:
        resp: operator_pb2.RetuneResponse = call_operator(
            target,
            lambda s: (
                waited(getattr(s, rpc).future(message, timeout=deadline), f"{command} {what}", timeout)
                if wait
                else getattr(s, rpc)(message, timeout=deadline)
            ),
        )
    except OperatorError as exc:
        print(f"gpufleet {command}: {clean(str(exc))}", file=sys.stderr)
        return 2 if exc.code in USAGE_ERRORS else 1
    _show(what, resp, output, wait)
    if not wait:
        return 0
    if not resp.done:
        why = resp.error or f"no answer within {timeout:.0f}s"
        print(clean(f"gpufleet {command}: {what}: {why} (command {resp.command_id})"), file=sys.stderr)
        return 1
    if not resp.HasField("result"):  # a drain: its error says how it ended other than drained
        if resp.error:
            print(clean(f"gpufleet {command}: {what}: {resp.error}"), file=sys.stderr)
        return 1 if resp.error else 0
    if resp.result.state not in OK_STATES:
        print(clean(f"gpufleet {command}: {what}: {resp.error or resp.result.state}"), file=sys.stderr)
        return 1
    return 0


def _confirm(node: str, profile: str, gpus: list[int]) -> bool | None:
    """True to go on, False when the operator said no; None off a terminal (--yes required)."""
    if not sys.stdin.isatty():
        return None
    where = f"GPUs {', '.join(map(str, gpus))}" if gpus else "every GPU"
    answer = input(f"Apply profile {profile} to node {node} ({where})? [y/N] ")
    return answer.strip().lower() in {"y", "yes"}


def retune(
    target: str,
    node: str,
    output: str,
    *,
    profile: str,
    dry_run: bool,
    yes: bool,
    reason: str,
    gpus: list[int],
    wait: bool,
    timeout: float,
) -> int:
    if not profile:
        print("gpufleet retune: --profile P is required (gpufleet profiles lists them)", file=sys.stderr)
        return 2
    if not 0 < timeout < math.inf:
        print("gpufleet retune: --timeout must be a finite number of seconds > 0", file=sys.stderr)
        return 2
    if any(g < 0 for g in gpus):
        print("gpufleet retune: --gpu must be a GPU index (>= 0)", file=sys.stderr)
        return 2
    if not dry_run and not yes:
        confirmed = _confirm(node, profile, gpus)
        if confirmed is None:
            print(
                f"gpufleet retune: not a terminal: pass --yes to apply {profile} to {node} "
                "(or --dry-run to see the plan)",
                file=sys.stderr,
            )
            return 2
        if not confirmed:
            print("gpufleet retune: nothing applied", file=sys.stderr)
            return 1
    message = operator_pb2.RetuneRequest(
        node=node,
        profile=profile,
        dry_run=dry_run,
        reason=reason,
        gpus=gpus,
        wait=wait,
        timeout_seconds=timeout,
    )
    what = f"{node}: {profile}" + (" (dry run)" if dry_run else "")
    return _call(target, message, rpc="Retune", what=what, output=output, wait=wait, timeout=timeout)


def approve(target: str, rec_id: str, output: str, *, reason: str, wait: bool, timeout: float) -> int:
    if not 0 < timeout < math.inf:
        print("gpufleet approve: --timeout must be a finite number of seconds > 0", file=sys.stderr)
        return 2
    message = operator_pb2.ApproveRequest(id=rec_id, reason=reason, wait=wait, timeout_seconds=timeout)
    what = f"recommendation {rec_id}"
    return _call(target, message, rpc="Approve", what=what, output=output, wait=wait, timeout=timeout)
