"""Node-supplied text in every table and line the CLI prints: plain text, never markup, and no
control character (ESC, C1, DEL, bidi override, a newline of the node's) reaching the terminal.

Every string field of every message a renderer reads is filled with a hostile string by walking
the protobuf descriptors, so a field added later is covered without touching this test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from rich.console import RenderableType
from rich.text import Text

from controller.cli import breaker, commands, gpu_tables, history, kube, recommendations, retune, tables
from controller.cli.bmc_view import bmc_section
from controller.cli.kube_view import kube_section
from controller.cli.layout import clean, plain, show
from protos.gpufleet.v1 import bmc_pb2, findings_pb2, operator_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.logsafe import CONTROL, escape_control

# Markup that crashes rich ([/] closes nothing), ANSI colour and screen clearing, an OSC 8 hyperlink,
# C1 CSI, DEL, a bidi override, a node's own newline and carriage return, a tab.
HOSTILE = "n[/]\x1b[31m\x1b]8;;http://evil\x07link\x1b]8;;\x07\x9b2J\x7f\u202eexe.sh\n\rforged\t[bold]x"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # the colours rich itself writes on a terminal
Capture = pytest.CaptureFixture[str]
M = TypeVar("M", bound=Message)


def hostile(cls: type[M], **fields: object) -> M:
    """A `cls` with every string field (nested messages, repeated fields and maps included) hostile."""
    message = cls()
    _fill(message, 0)
    for name, value in fields.items():
        setattr(message, name, value)
    return message


def _fill(message: Message, depth: int) -> None:
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.type == FieldDescriptor.TYPE_STRING:
            if field.is_repeated:
                value.extend([HOSTILE, HOSTILE + "2"])
            else:
                setattr(message, field.name, HOSTILE)
        elif field.type == FieldDescriptor.TYPE_MESSAGE and depth < 4:
            kind = field.message_type
            assert kind is not None
            if kind.full_name.startswith("google.protobuf."):
                continue  # timestamps and durations: numbers
            if kind.GetOptions().map_entry:
                key, item = kind.fields_by_name["key"], kind.fields_by_name["value"]
                k = HOSTILE if key.type == FieldDescriptor.TYPE_STRING else 1
                if item.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(value[k], depth + 1)
                elif item.type == FieldDescriptor.TYPE_STRING:
                    value[k] = HOSTILE
            elif field.is_repeated:
                _fill(value.add(), depth + 1)
            else:
                _fill(value, depth + 1)


def _host_line() -> Text:
    """The line `gpufleet node` prints about the host (built in operator.py, shown through show())."""
    h = hostile(pb.HostFacts)
    return Text(f"host {h.hostname}: {h.os}, kernel {h.kernel}, {h.cpu_count} CPUs ({h.cpu_model})")


def _kube() -> list[RenderableType]:
    k = hostile(operator_pb2.KubernetesNode, found=True)
    k.drain.outcome = "running"
    return kube_section(k, wide=True)


RENDERERS: dict[str, Callable[[], list[RenderableType]]] = {
    "nodes": lambda: [tables.nodes_table([hostile(operator_pb2.NodeSummary)], wide=True)],
    "nodes narrow": lambda: [tables.nodes_table([hostile(operator_pb2.NodeSummary)])],
    "findings": lambda: [tables.findings_table([hostile(findings_pb2.Finding)], wide=True)],
    "gpus": lambda: [gpu_tables.gpus_table([hostile(pb.GpuSample)], wide=True)],
    "probes": lambda: [
        gpu_tables.probes_table(
            [hostile(pb.ProbeResult), hostile(pb.ProbeResult, error="")],
            wide=True,
            units=gpu_tables.units_of(hostile(pb.Hello)),
        )
    ],
    "probes offered": lambda: [Text(gpu_tables.probes_offered(hostile(pb.Hello)))],
    "probe run": lambda: [
        gpu_tables.probe_run_table(
            [hostile(pb.ProbeResult), hostile(pb.ProbeResult, error="")],
            f"Probe results of {HOSTILE}",
            wide=True,
        )
    ],
    "host": lambda: [_host_line()],
    "bmc": lambda: [bmc_section(hostile(bmc_pb2.BmcSample), [hostile(pb.GpuSample)])],
    "bmc ok": lambda: [bmc_section(hostile(bmc_pb2.BmcSample, error="", success=True), [])],
    "kubernetes": _kube,
    "pods": lambda: [kube.pods_table(hostile(operator_pb2.DrainStatus), wide=True)],
    "history": lambda: [history.history_table([hostile(operator_pb2.AuditEntry)], wide=True)],
    "commands": lambda: [commands.commands_table([hostile(operator_pb2.CommandInfo)], wide=True)],
    "recommendations": lambda: [
        recommendations.recommendations_table([hostile(operator_pb2.Recommendation)], wide=True)
    ],
    "retune changes": lambda: [retune.changes_table(hostile(pb.ApplyProfileResult), wide=True)],
    "retune checks": lambda: [retune.checks_table(hostile(pb.ApplyProfileResult), wide=True)],
    "breaker": lambda: [
        breaker.headline(hostile(operator_pb2.BreakerStatus, tripped=True)),
        breaker.usage_table(hostile(operator_pb2.BreakerStatus), wide=True),
    ],
}


def assert_safe(out: str, *, whole: bool = True) -> None:
    """`whole`: every column is there (piped), so the hostile text must show."""
    assert out.strip(), "nothing printed"
    if whole:
        assert "[/]" in out  # shown as text, not taken as markup
        assert "\\x1b" in out and "\\u202e" in out  # shown as visible escapes
    leaked = {hex(ord(c)) for c in CONTROL.findall(SGR.sub("", out)) if c != "\n"}
    assert not leaked, f"control characters reached the terminal: {leaked}"


@pytest.mark.parametrize("name", sorted(RENDERERS))
@pytest.mark.parametrize("width", [None, 60, 200])
def test_every_table_prints_hostile_node_text_as_plain_escaped_text(
    name: str, width: int | None, capsys: Capture
) -> None:
    show(*RENDERERS[name](), width=width)  # narrowed to 60 or 200 columns, or piped (None): whole
    assert_safe(capsys.readouterr().out, whole=width is None)


@pytest.mark.parametrize("name", ["nodes", "bmc", "kubernetes", "history"])
def test_on_a_terminal_only_rich_own_colours_are_escape_sequences(
    name: str, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    show(*RENDERERS[name](), width=200)
    out = capsys.readouterr().out
    assert SGR.search(out), "a terminal gets colours"
    assert_safe(out)


def test_a_node_newline_is_an_escape_in_the_cell_not_a_new_row(capsys: Capture) -> None:
    show(tables.nodes_table([operator_pb2.NodeSummary(name="n1\nn2-forged", gpu_count=8)]))
    rows = [line for line in capsys.readouterr().out.splitlines() if "n1" in line]
    assert len(rows) == 1 and "n1\\nn2-forged" in rows[0]
    assert not any(line.lstrip("│ ").startswith("n2-forged") for line in rows)


def test_the_drain_and_retune_answers_print_escaped(capsys: Capture) -> None:
    kube.show_drain(hostile(operator_pb2.DrainStatus), "table")
    resp = hostile(operator_pb2.RetuneResponse, done=True)
    retune._show(f"{HOSTILE}: gpu-defaults", resp, "wide", True)
    assert_safe(capsys.readouterr().out)


def test_lines_for_print_and_cells_escape_the_same_way() -> None:
    assert clean(HOSTILE) == escape_control(HOSTILE) == plain(HOSTILE).plain
    assert not CONTROL.search(clean(HOSTILE))


def test_a_plaintext_node_is_marked_in_the_nodes_table(capsys: Capture) -> None:
    nodes = [
        operator_pb2.NodeSummary(name="n-tls", transport="mtls"),
        operator_pb2.NodeSummary(name="n-open", transport="plaintext"),
        operator_pb2.NodeSummary(name="n-old"),  # a controller older than the field
    ]
    show(tables.nodes_table(nodes), width=200)
    out = capsys.readouterr().out
    assert "n-open (plaintext)" in out
    assert "n-tls (plaintext)" not in out and "n-old (plaintext)" not in out
    show(tables.nodes_table(nodes, wide=True), width=250)
    wide = capsys.readouterr().out
    assert "TRANSPORT" in wide
    row = {line.split("│")[1].strip().split(" ")[0]: line for line in wide.splitlines() if "│ n-" in line}
    assert row["n-tls"].rstrip(" │").endswith("mtls")
    assert row["n-open"].rstrip(" │").endswith("plaintext")
    assert row["n-old"].rstrip(" │").endswith("-")
