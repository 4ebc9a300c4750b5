"""What the demo shows: a live panel while it runs, and the closing summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from controller.cli.tables import HEALTH_STYLE, findings_table
from controller.demo.plan import Injected
from controller.demo.probe_rounds import ProbeRounds
from protos.gpufleet.v1 import findings_pb2, operator_pb2
from protos.names import cause_name, health_name


def injected_table(injected: Sequence[Injected], findings: Sequence[findings_pb2.Finding]) -> Table:
    table = Table(title="Injected faults", title_justify="left")
    for column in ("NODE", "GPU", "FAULT", "FOUND AS"):
        table.add_column(column)
    for inj in injected:
        causes = sorted(
            {
                cause_name(f.cause)
                for f in findings
                if f.node == inj.node and (f.gpu if f.HasField("gpu") else None) == inj.gpu
            }
        )
        if not causes:
            found = Text("not found", style="bold red")
        else:
            found = Text(", ".join(causes), style="green" if inj.fault in causes else "yellow")
        table.add_row(inj.node, "-" if inj.gpu is None else str(inj.gpu), inj.fault, found)
    return table


def live_panel(
    nodes: Sequence[operator_pb2.NodeSummary],
    findings: Sequence[findings_pb2.Finding],
    injected: Sequence[Injected],
    *,
    elapsed: float,
    seconds: float | None,
    expected_nodes: int,
    rounds: ProbeRounds,
    seed: int | None = None,
) -> Any:
    connected = sum(1 for n in nodes if n.connected)
    frames = sum(n.acked_seq for n in nodes)
    health: dict[str, int] = {}
    for n in nodes:
        name = health_name(n.health)
        health[name] = health.get(name, 0) + 1
    until = f"/{seconds:.0f}s" if seconds else "s (Ctrl-C to stop)"
    header = Text.assemble(
        ("gpufleet demo ", "bold"),
        "" if seed is None else f"seed {seed}   ",
        f"{elapsed:.0f}{until}   agents {connected}/{expected_nodes} connected   frames stored {frames}   "
        f"probe rounds {rounds.total} ({rounds.later} scheduled)   ",
        *[(f"{k} {v}  ", HEALTH_STYLE.get(k, "")) for k, v in sorted(health.items())],
    )
    return Group(header, injected_table(injected, findings), findings_table(findings))
