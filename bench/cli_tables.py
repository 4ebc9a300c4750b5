"""How long `gpufleet nodes` takes to print N nodes, once the controller has answered: the table,
-o wide and -o json, each printed to memory as the CLI prints it (piped: every row whole, on one
line), and the table as rich's own Table lays it out cell by cell (how the CLI printed it before
controller/cli/table_body.py), with a check that the two are the same characters. The nodes are
made here (NodeSummary messages as ListNodes returns them); bench/controller_views.py times
ListNodes itself. Prints a table; asserts nothing (tests/bench/test_cli_tables.py runs a small step).

    .venv/bin/python bench/cli_tables.py [--nodes 12500] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import time
from collections.abc import Callable

from rich.console import Console

from controller.cli import tables
from controller.cli.jsonify import message_to_dict
from controller.cli.layout import PIPE_WIDTH, fit, show
from controller.cli.output import print_document
from protos.gpufleet.v1 import operator_pb2

MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200")
HEALTH = operator_pb2.NodeHealth


def fleet(n: int, now: int) -> list[operator_pb2.NodeSummary]:
    nodes = []
    for i in range(n):
        node = operator_pb2.NodeSummary(
            name=f"gpu-rack{i // 32:03d}-node{i % 32:02d}.cluster.example",
            health=HEALTH.Value("NODE_HEALTH_DEGRADED" if i % 17 == 0 else "NODE_HEALTH_HEALTHY"),
            gpu_count=8,
            gpu_model=MODELS[i % len(MODELS)],
            source="nvml",
            connected=i % 211 != 0,
            active_findings=int(i % 17 == 0),
            agent_version="0.9.0",
            boot_id=f"{i:08x}-5c1e-4d3a-9f00-{i * 7919 % 16**12:012x}",
            acked_seq=1000 + i,
            transport="tls" if i % 50 else "plaintext",
        )
        node.last_seen.seconds = now - 3600
        nodes.append(node)
    return nodes


def rich_table(nodes: list[operator_pb2.NodeSummary]) -> None:
    """The table laid out by rich's Table, as `show` printed it before."""
    table = tables.nodes_table(nodes)
    _, needed = fit(table, None)
    Console(width=max(PIPE_WIDTH, needed)).print(table, markup=False)


def timed(print_it: Callable[[], None], repeat: int) -> tuple[float, str]:
    """The median seconds of `repeat` prints, and what the last one printed."""
    times = []
    out = ""
    for _ in range(repeat):
        buffer = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(buffer):
            print_it()
        times.append(time.perf_counter() - start)
        out = buffer.getvalue()
    return statistics.median(times), out


def run(n: int, repeat: int) -> dict[str, object]:
    nodes = fleet(n, int(time.time()))
    ways: dict[str, Callable[[], None]] = {
        "table": lambda: show(tables.nodes_table(nodes)),
        "wide": lambda: show(tables.nodes_table(nodes, wide=True)),
        "json": lambda: print_document({"nodes": [message_to_dict(x) for x in nodes]}, "json"),
        "table (rich's layout)": lambda: rich_table(nodes),
    }
    results: dict[str, object] = {"nodes": n}
    printed: dict[str, str] = {}
    for name, way in ways.items():
        seconds, printed[name] = timed(way, repeat)
        results[name] = {"s": round(seconds, 3), "ms_per_1000_nodes": round(seconds / n * 1e6, 1)}
    results["same_as_rich"] = printed["table"] == printed["table (rich's layout)"]
    results["table_lines"] = printed["table"].count("\n")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    results = run(args.nodes, args.repeat)
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"gpufleet nodes, {args.nodes} nodes, printed to memory (median of {args.repeat}):")
    print(f"  {'output':<24} {'s':>8} {'ms/1000 nodes':>14}")
    for name, value in results.items():
        if isinstance(value, dict):
            print(f"  {name:<24} {value['s']:>8.3f} {value['ms_per_1000_nodes']:>14.1f}")
    print(f"  table is rich's, character for character: {'yes' if results['same_as_rich'] else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
