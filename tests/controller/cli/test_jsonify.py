"""Contract messages -> JSON-ready dicts, as `gpufleet ... -o json` prints them."""

from __future__ import annotations

import json
import math

from controller.cli.jsonify import finding_to_dict, message_to_dict
from protos.gpufleet.v1 import findings_pb2, operator_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

T0 = 1_800_000_000  # 2027-01-15T08:00:00Z


def test_unset_optional_fields_are_left_out_and_set_zeros_kept() -> None:
    sample = pb.GpuSample(index=0, power_watts=0.0, row_remap_pending=False)
    assert message_to_dict(sample) == {
        "index": 0,
        "uuid": "",
        "power_watts": 0.0,
        "row_remap_pending": False,
        "nvlinks": [],
        "processes": [],
        "xid_events": [],
        "xid_counts": [],
        "fabric_cluster_uuid": "",
    }


def test_unset_messages_are_left_out_and_set_ones_nested() -> None:
    result = pb.ProbeResult(probe="gemm", value=1.0)
    assert "during" not in message_to_dict(result) and "time" not in message_to_dict(result)
    result.during.index = 3
    result.params["size"] = "8192"
    out = message_to_dict(result)
    assert out["during"]["index"] == 3
    assert out["params"] == {"size": "8192"}


def test_enums_are_lower_case_names_and_unspecified_is_null() -> None:
    summary = operator_pb2.NodeSummary(name="n", health=operator_pb2.NODE_HEALTH_STALE)
    assert message_to_dict(summary)["health"] == "stale"
    assert message_to_dict(operator_pb2.NodeSummary(name="n"))["health"] is None
    finding = findings_pb2.Finding(cause=findings_pb2.CAUSE_ECC_ROW_REMAP_PENDING)
    out = message_to_dict(finding)
    assert (out["cause"], out["severity"]) == ("ecc_row_remap_pending", None)


def test_an_enum_value_newer_than_the_cli_keeps_its_number() -> None:
    sent = findings_pb2.Finding(node="n", cause=99, severity=7)  # type: ignore[arg-type] # unknown here
    newer = findings_pb2.Finding.FromString(sent.SerializeToString())
    assert message_to_dict(newer)["cause"] == 99
    out = finding_to_dict(newer)
    assert (out["cause"], out["severity"]) == (99, 7)


def test_64_bit_integers_stay_exact_numbers() -> None:
    big = 2**64 - 1
    frame = pb.TelemetryFrame(seq=big, spool_floor_seq=2**63 + 1)
    frame.gpus.add(index=0, memory_used_bytes=big, clock_event_reasons=2**40)
    out = message_to_dict(frame)
    assert out["seq"] == big and isinstance(out["seq"], int)
    assert out["spool_floor_seq"] == 2**63 + 1
    assert out["gpus"][0]["memory_used_bytes"] == big
    assert json.loads(json.dumps(out))["seq"] == big  # not a string, unlike protobuf's own JSON


def test_timestamps_are_rfc3339_utc() -> None:
    frame = pb.TelemetryFrame()
    frame.time.FromSeconds(T0)
    assert message_to_dict(frame)["time"] == "2027-01-15T08:00:00Z"
    frame.time.FromNanoseconds(T0 * 10**9 + 500_000_000)
    assert message_to_dict(frame)["time"] == "2027-01-15T08:00:00.500Z"


def test_nan_and_inf_become_null_so_strict_json_holds() -> None:
    sample = pb.GpuSample(index=1, temperature_celsius=math.nan, power_watts=math.inf, sm_clock_hz=1.5e9)
    out = message_to_dict(sample)
    assert (out["temperature_celsius"], out["power_watts"], out["sm_clock_hz"]) == (None, None, 1.5e9)
    evidence = findings_pb2.Evidence(metric="m", value=-math.inf, baseline=2.0)
    assert message_to_dict(evidence)["value"] is None
    json.dumps([out, message_to_dict(evidence)], allow_nan=False)


def test_repeated_fields_are_lists() -> None:
    sample = pb.GpuSample(index=0)
    sample.nvlinks.add(link=0, active=True, crc_errors_total=5)
    sample.nvlinks.add(link=1, active=False)
    hello = pb.Hello(node="n", capabilities=["run_probes"], probes=["gemm", "membw"])
    assert message_to_dict(sample)["nvlinks"] == [
        {"link": 0, "active": True, "crc_errors_total": 5, "remote_pci_bus_id": ""},
        {"link": 1, "active": False, "remote_pci_bus_id": ""},
    ]
    out = message_to_dict(hello)
    assert (out["capabilities"], out["probes"]) == (["run_probes"], ["gemm", "membw"])
    assert "inventory" not in out and "started_at" not in out


def finding(**fields: object) -> findings_pb2.Finding:
    msg = findings_pb2.Finding(
        id="f1",
        node="n1",
        cause=findings_pb2.CAUSE_NVLINK_DOWN,
        severity=findings_pb2.SEVERITY_CRITICAL,
        summary="links down",
        active=True,
        detectors=["nvlink"],
        **fields,  # type: ignore[arg-type]
    )
    msg.evidence.metric = "nvlink.active"
    msg.evidence.value = 4.0
    msg.first_seen.FromSeconds(T0)
    return msg


def test_finding_gpu_is_null_when_node_level_and_zero_when_gpu_0() -> None:
    node_level = finding_to_dict(finding())
    assert list(node_level)[:3] == ["id", "node", "gpu"]
    assert node_level["gpu"] is None
    assert finding_to_dict(finding(gpu=0))["gpu"] == 0
    assert node_level == {
        "id": "f1",
        "node": "n1",
        "gpu": None,
        "cause": "nvlink_down",
        "severity": "critical",
        "summary": "links down",
        "evidence": {
            "metric": "nvlink.active",
            "value": 4.0,
            "unit": "",
            "reasons": [],
            "peers": 0,
            "detail": "",
            "baseline_source": "",
        },
        "supporting": [],
        "first_seen": "2027-01-15T08:00:00Z",
        "active": True,
        "detectors": ["nvlink"],
        "remediation": "",
        "silenced_by": "",
    }
    json.dumps(node_level, allow_nan=False)
