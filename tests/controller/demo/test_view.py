"""What the demo shows: the injected-faults table keeps node, GPU and fault whole, and calls a fault
found when the cause the agent lists for it was reported there."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from controller.demo.catalogue import AgentFault
from controller.demo.plan import Injected, plan_faults
from controller.demo.view import injected_table
from protos.gpufleet.v1 import findings_pb2
from protos.names import cause_value


def printed(table: Table, width: int) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width).print(table)
    return buf.getvalue()


@pytest.mark.parametrize(("width", "node"), [(40, "demo-07"), (50, "demo-node-0007")])
def test_the_injected_table_never_cuts_node_gpu_or_fault(width: int, node: str) -> None:
    out = printed(injected_table([Injected(node, 3, "ecc_row_remap_pending")], []), width)
    assert node in out and "ecc_row_remap_pending" in out and " 3 " in out


def finding(node: str, gpu: int | None, cause: str) -> findings_pb2.Finding:
    f = findings_pb2.Finding(node=node, cause=cause_value(cause))  # type: ignore[arg-type]
    if gpu is not None:
        f.gpu = gpu
    return f


def found_style(injected: Injected, findings: list[findings_pb2.Finding]) -> str:
    table = injected_table([injected], findings)
    cell = table.columns[-1]._cells[0]
    return str(getattr(cell, "style", ""))


def test_a_fault_is_found_when_its_listed_cause_is_reported_whatever_its_name() -> None:
    kinds = [AgentFault("ib_port_down", "network", "ib_link_degraded", ("ib.ports",))]
    (injected,) = plan_faults(["demo-03"], 8, 1, 0, kinds)
    assert injected == Injected("demo-03", None, "ib_port_down", "ib_link_degraded")
    assert found_style(injected, [finding("demo-03", None, "ib_link_degraded")]) == "green"
    assert found_style(injected, [finding("demo-03", None, "slow_unknown")]) == "yellow"
    assert found_style(injected, [finding("demo-04", None, "ib_link_degraded")]) == "bold red"
