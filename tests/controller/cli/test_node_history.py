"""`gpufleet node NAME --history`: findings opening and resolving merged with audit entries, by time."""

from __future__ import annotations

import json
import time

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from controller.cli import node_history
from controller.cli.layout import show
from controller.main import main
from protos.gpufleet.v1 import findings_pb2, operator_pb2
from tests.controller.cli import test_escaping as esc
from tests.controller.cli.fake_operator import FakeOperator, serving
from tests.controller.harness import T0

Capture = pytest.CaptureFixture[str]


def ts(offset: float) -> Timestamp:
    out = Timestamp()
    out.FromNanoseconds(int((T0 + offset) * 1e9))
    return out


def finding(
    fid: str, opened: float, last: float, *, active: bool, gpu: int | None = 0
) -> findings_pb2.Finding:
    f = findings_pb2.Finding(
        id=fid,
        node="n1",
        cause=findings_pb2.CAUSE_THERMAL_THROTTLE,
        severity=findings_pb2.SEVERITY_WARNING,
        summary=f"{fid} summary",
        evidence=findings_pb2.Evidence(
            detail="hot", value=91, baseline=87, unit="C", baseline_source="expected"
        ),
        first_seen=ts(opened),
        last_seen=ts(last),
        active=active,
        remediation="drain and repair: cool it",
    )
    if gpu is not None:
        f.gpu = gpu
    return f


def entry(eid: str, at: float, action: str) -> operator_pb2.AuditEntry:
    return operator_pb2.AuditEntry(
        id=eid,
        time=ts(at),
        requester="operator:alice",
        action=action,
        node="n1",
        parameters='{"finding": "f-old"}',
        reason="seen",
        outcome="succeeded",
    )


# f-old opened at +0, resolved at +300; f-new opened at +200 and is still open; audit entries come
# newest first from the controller, one at the very moment f-old resolved.
FINDINGS = [finding("f-new", 200, 400, active=True, gpu=None), finding("f-old", 0, 300, active=False)]
AUDIT = [entry("a-3", 300, "retune"), entry("a-2", 250, "silence"), entry("a-1", 100, "ack")]
ORDER = [
    ("finding_opened", "f-old"),
    ("audit", "a-1"),
    ("finding_opened", "f-new"),
    ("audit", "a-2"),
    ("audit", "a-3"),  # same instant as the resolve: the audit entry first
    ("finding_resolved", "f-old"),
]


def test_timeline_merges_by_time_newest_last() -> None:
    events = node_history.timeline(FINDINGS, AUDIT)
    assert [(e.kind, e.entry.id if e.entry else e.finding.id if e.finding else "") for e in events] == ORDER


def test_json_history_through_main(capsys: Capture) -> None:
    fake = FakeOperator(findings=FINDINGS, audit=AUDIT)
    with serving(fake) as address:
        before = time.time()
        argv = ["node", "n1", "--history", "--since", "7d", "--controller", address, "-o", "json"]
        assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["node"] == "n1" and doc["since"].endswith("Z")
    assert [(e["kind"], e.get("finding_id") or e.get("id")) for e in doc["events"]] == ORDER
    times = [e["time"] for e in doc["events"]]
    assert times == sorted(times) and times[0] == "2027-01-15T08:00:00Z"
    opened = doc["events"][0]
    assert opened == {
        "time": "2027-01-15T08:00:00Z",
        "kind": "finding_opened",
        "finding_id": "f-old",
        "gpu": 0,
        "cause": "thermal_throttle",
        "severity": "warning",
        "summary": "f-old summary",
        "evidence": "hot; 91 C vs 87 C (expected)",
        "remediation": "drain and repair: cool it",
    }
    assert doc["events"][2]["gpu"] is None  # node-level
    ack = doc["events"][1]
    assert (
        ack["action"] == "ack"
        and ack["requester"] == "operator:alice"
        and ack["parameters"] == {"finding": "f-old"}
    )
    # what was asked: resolved and silenced findings of this node, its audit entries, both since 7d ago
    (findings_request,) = fake.asked("ListFindings")
    (audit_request,) = fake.asked("ListAudit")
    assert (
        findings_request.node == "n1"
        and findings_request.include_resolved
        and findings_request.include_silenced
    )
    assert audit_request.node == "n1" and audit_request.limit == node_history.AUDIT_LIMIT
    week_ago = before - 7 * 86400
    assert abs(findings_request.since.ToNanoseconds() / 1e9 - week_ago) < 5
    assert audit_request.since == findings_request.since
    assert fake.asked("GetNode") == []  # there was history: no need to ask whether the node exists


def test_table_history(capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    fake = FakeOperator(findings=FINDINGS, audit=AUDIT)
    with serving(fake) as address:
        assert node_history.node_history(address, "n1", "table") == 0
    out = capsys.readouterr().out
    assert "History of n1" in out
    rows = [line for line in out.splitlines() if line.startswith("│ 2027-")]
    assert [r.split("│")[2].strip() for r in rows] == [
        "opened",
        "audit",
        "opened",
        "audit",
        "audit",
        "resolved",
    ]
    assert "after 5m" in rows[-1] and "thermal_throttle (warning)" in rows[-1]
    assert "ack succeeded" in rows[1] and "operator:alice" in rows[1]
    assert "hot; 91 C vs 87 C (expected)" in rows[0]
    assert not fake.asked("ListFindings")[0].HasField("since")  # no --since: from the start


def test_an_unknown_node_with_no_history_is_one_line_and_exit_1(capsys: Capture) -> None:
    fake = FakeOperator(known={"quiet"})
    with serving(fake) as address:
        assert main(["node", "nope", "--history", "--controller", address]) == 1
        assert capsys.readouterr() == ("", "gpufleet: node nope not found\n")
        assert main(["node", "quiet", "--history", "--controller", address, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"node": "quiet", "since": None, "events": []}


@pytest.mark.parametrize(
    "argv", [["--history", "--since", "soon"], ["--since", "1h"]], ids=["bad-since", "since-without-history"]
)
def test_bad_arguments_are_one_line_and_exit_2(argv: list[str], capsys: Capture) -> None:
    fake = FakeOperator()
    with serving(fake) as address:
        assert main(["node", "n1", *argv, "--controller", address]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("gpufleet: --since") and err.count("\n") == 1
    assert fake.requests == []


@pytest.mark.parametrize("width", [None, 60, 200])
def test_hostile_text_in_the_history_is_escaped(width: int | None, capsys: Capture) -> None:
    f = esc.hostile(findings_pb2.Finding, active=False)
    events = node_history.timeline([f], [esc.hostile(operator_pb2.AuditEntry)])
    show(node_history.history_table(esc.HOSTILE, events, wide=True), width=width)
    esc.assert_safe(capsys.readouterr().out, whole=width is None)
