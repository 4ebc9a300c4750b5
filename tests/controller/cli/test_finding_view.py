"""Findings as an operator reads them: evidence in units with the baseline's origin, the remediation
line, ack and silence marks, in the findings table, the node view and -o json; and --since."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from controller.app import ControllerApp
from controller.cli import finding_view, operator, tables
from controller.cli.jsonify import finding_to_dict
from controller.cli.layout import show
from controller.fleet.finding import Evidence, Finding
from controller.fleet.findings import StoredFinding, finding_id
from controller.main import main
from protos.gpufleet.v1 import findings_pb2, operator_pb2
from tests.controller.cli import test_escaping as esc
from tests.controller.cli.fake_operator import FakeOperator, serving
from tests.controller.harness import T0, Clock, ControllerThread, config, populate

Capture = pytest.CaptureFixture[str]


def clock_finding(**fields: object) -> findings_pb2.Finding:
    """A clocks_locked_low finding on GPU 3 with peer evidence, supporting evidence and marks."""
    f = findings_pb2.Finding(
        id="f-1",
        node="n7",
        gpu=3,
        cause=findings_pb2.CAUSE_CLOCKS_LOCKED_LOW,
        severity=findings_pb2.SEVERITY_WARNING,
        summary="GPU 3 slow",
        evidence=findings_pb2.Evidence(
            metric="sm_clock_hz",
            value=1.74e9,
            baseline=1.98e9,
            deviation=-0.1212,
            unit="Hz",
            peers=31,
            baseline_source="peers",
            detail="SM clock below its peers at similar power",
        ),
        supporting=[
            findings_pb2.Evidence(
                metric="applications_sm_clock_hz", value=1.74e9, unit="Hz", detail="clocks locked"
            ),
            findings_pb2.Evidence(
                metric="probe.gemm.bf16",
                value=612.0,
                baseline=700.0,
                unit="TFLOPS",
                baseline_source="own_history",
            ),
        ],
        remediation="retune: gpu-defaults (gpu.locked_gpu_clocks)",
        ack=findings_pb2.FindingAck(by="alice", comment="on it", time=Timestamp(seconds=int(T0))),
        silenced_by="s-123",
        active=True,
    )
    for name, value in fields.items():
        setattr(f, name, value)
    return f


def test_numbers_carry_their_units() -> None:
    assert finding_view.number(1.74e9, "Hz") == "1740 MHz"
    assert finding_view.number(4, "gen") == "gen4"
    assert finding_view.number(402.4, "W") == "402 W"
    assert finding_view.number(0.125, "") == "0.125"
    assert finding_view.number(12.345, "C") == "12.3 C"
    assert [finding_view.duration(s) for s in (45, 720, 3 * 3600, 2 * 86400 + 5)] == [
        "45s",
        "12m",
        "3h",
        "2d",
    ]


def test_an_evidence_line_says_value_baseline_and_where_the_baseline_came_from() -> None:
    f = clock_finding()
    assert finding_view.evidence_line(f.evidence) == (
        "SM clock below its peers at similar power; 1740 MHz vs 1980 MHz (peers, 31) -12.1%"
    )
    assert (
        finding_view.evidence_line(f.supporting[1])
        == "probe.gemm.bf16; 612 TFLOPS vs 700 TFLOPS (own_history)"
    )
    held = findings_pb2.Evidence(detail="SM clock held low", held_seconds=95, reasons=["hw_thermal_slowdown"])
    assert finding_view.evidence_line(held) == "SM clock held low; held 95s; reasons: hw_thermal_slowdown"
    old = findings_pb2.Evidence(value=400, baseline=700, unit="W", peers=7)  # a controller without sources
    assert finding_view.quantities(old) == "400 W vs 700 W (7 peers)"
    assert finding_view.evidence_line(findings_pb2.Evidence()) == ""


def test_an_evidence_line_leaves_out_the_numbers_and_reasons_its_detail_already_says() -> None:
    probe = findings_pb2.Evidence(
        detail="pcie h2d 27.8 GB/s is 49.6% below the median of 128 peers (55.0; NVIDIA H100 80GB HBM3)",
        value=27.8,
        baseline=55.0,
        deviation=-0.4964,
        unit="GB/s",
        peers=128,
        baseline_source="peers",
    )
    assert finding_view.evidence_line(probe) == probe.detail
    # One figure the detail does not say (here the peer count), and the whole reading is printed.
    other = findings_pb2.Evidence()
    other.CopyFrom(probe)
    other.peers = 127
    assert finding_view.evidence_line(other) == f"{probe.detail}; 27.8 GB/s vs 55 GB/s (peers, 127) -49.6%"
    wide = findings_pb2.Evidence(
        detail="membw d2d 2,421.7 GB/s is 18.0% below the median of 128 peers (2,952.2)",
        value=2421.7,
        baseline=2952.2,
        deviation=-0.1797,
        unit="GB/s",
        peers=128,
        baseline_source="peers",
    )
    assert finding_view.evidence_line(wide) == wide.detail
    # A clock in Hz is said in MHz.
    clock = findings_pb2.Evidence(
        detail="SM clock 1740 MHz, 12.1% under 1980",
        value=1.74e9,
        baseline=1.98e9,
        deviation=-0.1212,
        unit="Hz",
    )
    assert finding_view.evidence_line(clock) == clock.detail
    # Reasons the detail says word for word are left out; one word it does not say keeps them all.
    drift = findings_pb2.Evidence(
        detail="numa_balancing on; 15 of 16 in the peer group off", reasons=["numa_balancing", "on"]
    )
    assert finding_view.evidence_line(drift) == drift.detail
    inlet = findings_pb2.Evidence(
        detail="Inlet_Temp at 37.6 C, caution threshold 35 C", reasons=["Inlet_Temp", "above_caution"]
    )
    assert finding_view.evidence_line(inlet) == f"{inlet.detail}; reasons: Inlet_Temp, above_caution"
    # A reading without a baseline is printed even where its one figure stands in the detail.
    alone = findings_pb2.Evidence(detail="XID 79 on GPU 4", value=4, unit="")
    assert finding_view.evidence_line(alone) == "XID 79 on GPU 4; 4"


def test_the_findings_table_shows_evidence_remediation_and_marks(capsys: Capture) -> None:
    resolved = clock_finding(id="f-2", gpu=4, silenced_by="", active=False)
    show(tables.findings_table([clock_finding(), resolved]))  # piped: whole
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "NODE" in line)
    assert "EVIDENCE" in header and "REMEDIATION" in header
    row, row2 = (line for line in out.splitlines() if "clocks_locked_low" in line)  # one line each, piped
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == [
        "n7",
        "3",
        "clocks_locked_low",
        "warning; acked by alice; silenced (s-123)",
        "-",  # SINCE: no first_seen
        "SM clock below its peers at similar power; 1740 MHz vs 1980 MHz (peers, 31) -12.1% (+2 supporting)",
        "retune: gpu-defaults (gpu.locked_gpu_clocks)",
    ]
    assert "│ warning (resolved); acked by alice " in row2


def test_on_a_narrow_terminal_evidence_and_remediation_stay_longest(capsys: Capture) -> None:
    show(tables.findings_table([clock_finding()]), width=100)
    header = next(line for line in capsys.readouterr().out.splitlines() if "NODE" in line)
    assert "EVIDENCE" in header and "REMEDIATION" in header and "SINCE" not in header


def test_a_bare_finding_renders_with_dashes(capsys: Capture) -> None:
    bare = findings_pb2.Finding(node="n1")
    show(tables.findings_table([bare]), *finding_view.findings_detail([bare]))
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if "│ n1 " in line]
    assert row.rstrip(" │").endswith("│ -")  # no remediation
    assert "Evidence and remediation" in out and "n1 (node) - (resolved)" in out
    assert finding_view.status_marks(bare) == [] and finding_view.remediation_cell(bare) == "-"


def test_the_node_view_lists_every_evidence_line(capsys: Capture) -> None:
    newer = clock_finding(cause=99, active=False)  # a cause newer than this CLI: its number
    newer.ClearField("ack")
    show(*finding_view.findings_detail([clock_finding(), newer]))
    lines = capsys.readouterr().out.splitlines()
    assert lines[:9] == [
        "Evidence and remediation",
        "n7 GPU 3 clocks_locked_low (warning): GPU 3 slow",
        "  evidence: SM clock below its peers at similar power; 1740 MHz vs 1980 MHz (peers, 31) -12.1%",
        "  supporting: clocks locked; 1740 MHz",
        "  supporting: probe.gemm.bf16; 612 TFLOPS vs 700 TFLOPS (own_history)",
        "  remediation: retune: gpu-defaults (gpu.locked_gpu_clocks)",
        "  acked by alice at 2027-01-15T08:00:00Z: on it",
        "  silenced (s-123)",
        "n7 GPU 3 99 (warning, resolved): GPU 3 slow",
    ]


@pytest.mark.parametrize("width", [None, 60, 200])
def test_hostile_node_text_in_the_node_view_is_escaped(width: int | None, capsys: Capture) -> None:
    show(*finding_view.findings_detail([esc.hostile(findings_pb2.Finding)]), width=width)
    esc.assert_safe(capsys.readouterr().out, whole=width is None)


def test_json_carries_remediation_supporting_evidence_and_marks() -> None:
    doc = finding_to_dict(clock_finding())
    assert doc["remediation"] == "retune: gpu-defaults (gpu.locked_gpu_clocks)"
    assert doc["evidence"]["baseline_source"] == "peers" and doc["evidence"]["peers"] == 31
    assert [e["metric"] for e in doc["supporting"]] == ["applications_sm_clock_hz", "probe.gemm.bf16"]
    assert doc["supporting"][1]["baseline_source"] == "own_history"
    assert doc["ack"] == {"by": "alice", "comment": "on it", "time": "2027-01-15T08:00:00Z"}
    assert doc["silenced_by"] == "s-123"
    json.dumps(doc, allow_nan=False)


# Through a real controller: the operator API fills the remediation; the CLI shows it.


@pytest.fixture(scope="module")
def controller() -> Iterator[ControllerThread]:
    clock = Clock()
    with ControllerThread(config(stale_after_seconds=60.0), clock) as c:

        async def setup(app: ControllerApp) -> None:
            await populate(app, clock)
            evidence = Evidence(
                "probe.gemm.bf16", 612.0, 700.0, -0.126, "TFLOPS", peers=5, baseline_source="peers"
            )
            support = Evidence(
                "applications_sm_clock_hz", 1.2e9, 1.98e9, unit="Hz", baseline_source="expected"
            )
            finding = Finding(
                "a-healthy", 1, "clocks_locked_low", "warning", "slow", evidence, [support], ["x"]
            )
            stored = StoredFinding(finding_id(finding.key, T0), finding, T0, T0 + 5, True)
            await app.store.save_findings([stored], [])
            app.active[finding.key] = stored

        c.call(setup)
        yield c


def test_findings_json_from_a_controller_has_remediation_and_supporting(
    controller: ControllerThread, capsys: Capture
) -> None:
    assert operator.findings(controller.address, "json", node="a-healthy") == 0
    (found,) = json.loads(capsys.readouterr().out)["findings"]
    assert found["remediation"] == "retune: gpu-defaults (gpu.locked_gpu_clocks, gpu.locked_memory_clocks)"
    assert found["evidence"]["baseline_source"] == "peers"
    assert found["supporting"][0]["baseline_source"] == "expected"
    assert found["supporting"][0]["baseline"] == 1.98e9


def test_node_table_from_a_controller_shows_evidence_and_remediation(
    controller: ControllerThread, capsys: Capture
) -> None:
    assert operator.node(controller.address, "a-healthy", "table") == 0
    out = capsys.readouterr().out
    assert "a-healthy GPU 1 clocks_locked_low (warning): slow" in out
    assert "  evidence: probe.gemm.bf16; 612 TFLOPS vs 700 TFLOPS (peers, 5) -12.6%" in out
    assert "  supporting: applications_sm_clock_hz; 1200 MHz vs 1980 MHz (expected)" in out
    assert "  remediation: retune: gpu-defaults (gpu.locked_gpu_clocks, gpu.locked_memory_clocks)" in out


# --since and --all: what the CLI asks the controller.


def test_findings_since_a_duration_asks_for_resolved_findings_seen_since(capsys: Capture) -> None:
    fake = FakeOperator(findings=[clock_finding()])
    with serving(fake) as address:
        before = time.time()
        assert main(["findings", "--controller", address, "--since", "90m", "-o", "json"]) == 0
        after = time.time()
    (request,) = fake.asked("ListFindings")
    assert request.include_resolved and not request.include_silenced
    assert before - 5400 - 1 <= request.since.ToNanoseconds() / 1e9 <= after - 5400
    assert json.loads(capsys.readouterr().out)["findings"][0]["id"] == "f-1"


@pytest.mark.parametrize(
    ("since", "seconds"),
    [("2027-01-15T08:00:00Z", T0), ("2027-01-15T09:00:00+01:00", T0), ("2027-01-15T08:00:00", T0)],
)
def test_findings_since_an_rfc3339_time(since: str, seconds: float, capsys: Capture) -> None:
    fake = FakeOperator()
    with serving(fake) as address:
        assert main(["findings", "--controller", address, "--since", since]) == 0
    (request,) = fake.asked("ListFindings")
    assert request.since.seconds == seconds and request.include_resolved


@pytest.mark.parametrize("since", ["yesterday", "-1h", "1y", "2027-13-01"])
def test_a_bad_since_is_one_line_and_exit_2(since: str, capsys: Capture) -> None:
    fake = FakeOperator()
    with serving(fake) as address:
        assert main(["findings", "--controller", address, f"--since={since}"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("gpufleet: --since must be a duration")
    assert fake.requests == []  # nothing asked


def test_findings_all_includes_resolved_and_silenced(capsys: Capture) -> None:
    fake = FakeOperator()
    with serving(fake) as address:
        assert main(["findings", "--controller", address, "--all"]) == 0
        assert main(["findings", "--controller", address]) == 0
    every, plain = fake.asked("ListFindings")
    assert every.include_resolved and every.include_silenced and not every.HasField("since")
    assert not plain.include_resolved and not plain.include_silenced
    assert isinstance(plain, operator_pb2.ListFindingsRequest)
