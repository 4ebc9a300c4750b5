"""What the demo shows: a live panel while it runs, and the closing summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from controller.cli.layout import PIPE_WIDTH, Col, make_table
from controller.cli.tables import HEALTH_STYLE, findings_table
from controller.demo.plan import Injected
from controller.demo.probe_rounds import ProbeRounds
from protos.gpufleet.v1 import findings_pb2, operator_pb2
from protos.names import cause_name, health_name


def injected_table(injected: Sequence[Injected], findings: Sequence[findings_pb2.Finding]) -> Table:
    """What was injected where, and the causes found there: green when the fault's own cause (as
    the agent's --list-faults names it) is among them. Node, GPU and fault are never cut."""
    rows = []
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
            found = Text(", ".join(causes), style="green" if (inj.cause or inj.fault) in causes else "yellow")
        rows.append((inj.node, "-" if inj.gpu is None else str(inj.gpu), inj.fault, found))
    columns = [Col("NODE", key=True), Col("GPU", key=True), Col("FAULT", key=True)]
    columns.append(Col("FOUND AS", wrap=True))
    table = make_table("Injected faults", columns, rows)
    table.min_width = _narrowest(table)  # narrower consoles crop FOUND AS at the right, not the keys
    return table


def _narrowest(table: Table) -> int:
    """The table's width with its key columns whole and the others at their longest word: printed
    (or shown live) narrower than that, rich would squeeze the key columns too."""
    console = Console(width=PIPE_WIDTH)
    cells = 0
    for column in table.columns:
        if isinstance(column, Col) and column.key:
            cells += column.min_width or 0
        else:
            renderables: list[RenderableType] = [column.header, *column.cells]
            cells += max(Measurement.get(console, console.options, c).minimum for c in renderables)
    n = len(table.columns)
    return cells + 2 * n + (n + 1 if table.box else 0)


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
