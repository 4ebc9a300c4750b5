"""A finding as an operator reads it: its evidence in units, where each baseline came from, what to
do about it (the remediation line) and who has acknowledged or silenced it.

`evidence_cell`, `status_marks` and `remediation_cell` make the findings table's cells; `findings_detail`
is the section under the findings table of `gpufleet node NAME`: every evidence line of each finding.
Every string here may come from a node (details, units, reasons): the table and `show` print them
as plain, escaped text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.text import Text

from controller.cli.layout import plain
from controller.cli.said import figures, says_figure, says_words
from protos.gpufleet.v1 import findings_pb2
from protos.names import cause_name, severity_name

HERTZ_PER_MHZ = 1e6
PERCENT_PLACES = 1


def number(value: float, unit: str) -> str:
    """A reading with its unit, as the CLI prints it: "1740 MHz" (Hz shown in MHz), "gen4", "402 W"."""
    if unit == "Hz":
        value, unit = value / HERTZ_PER_MHZ, "MHz"
    if unit == "gen":
        return f"gen{value:.0f}"
    text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}" if unit else text


def duration(seconds: float) -> str:
    """ "45s", "12m", "3h", "2d": the largest unit of which there are at least two."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _named(name: Callable[[int], str], value: int) -> str:
    """An enum value's name; its number when it is newer than this CLI."""
    try:
        return name(value)
    except ValueError:
        return str(value)


def baseline_origin(ev: findings_pb2.Evidence) -> str:
    """Where the baseline came from and how many peers: "peers, 31", "own_history", "31 peers"."""
    source = ev.baseline_source
    if source == "peers" and ev.peers:
        return f"peers, {ev.peers}"
    if source:
        return source
    return f"{ev.peers} peers" if ev.peers else ""


def quantities(ev: findings_pb2.Evidence, detail: str = "") -> str:
    """The numbers behind one piece of evidence: "1740 MHz vs 1980 MHz (peers, 31) -12.1%", "402 W",
    "held 45s", "reasons: hw_thermal_slowdown"; "" when it carries none. Given the evidence's
    `detail`, a part whose every figure or word the detail already says is left out."""
    said = figures(detail)
    parts: list[str] = []
    if ev.HasField("value") and not _reading_said(ev, said):
        reading = number(ev.value, ev.unit)
        if ev.HasField("baseline"):
            reading += f" vs {number(ev.baseline, ev.unit)}"
            origin = baseline_origin(ev)
            if origin:
                reading += f" ({origin})"
        if ev.HasField("deviation"):
            reading += f" {ev.deviation:+.{PERCENT_PLACES}%}"
        parts.append(reading)
    if ev.HasField("held_seconds") and not says_words(detail, [duration(ev.held_seconds)]):
        parts.append(f"held {duration(ev.held_seconds)}")
    if ev.reasons and not (detail and says_words(detail, list(ev.reasons))):
        parts.append("reasons: " + ", ".join(ev.reasons))
    return "; ".join(parts)


def _reading_said(ev: findings_pb2.Evidence, said: list[tuple[float, float]]) -> bool:
    """Whether the detail's figures hold the reading, its baseline, deviation and peer count. A reading
    without a baseline is short and always printed: one figure alone may match the detail by chance
    ("GPU 4")."""
    if not said or not ev.HasField("baseline"):
        return False
    scale = 1 / HERTZ_PER_MHZ if ev.unit == "Hz" else 1.0
    wanted = [ev.value * scale]
    if ev.HasField("baseline"):
        wanted.append(ev.baseline * scale)
    if ev.HasField("deviation"):
        wanted.append(ev.deviation * 100)
    if ev.peers and baseline_origin(ev).startswith("peers"):
        wanted.append(ev.peers)
    return all(says_figure(said, w) for w in wanted)


def evidence_line(ev: findings_pb2.Evidence) -> str:
    """One piece of evidence on one line: its detail (else its metric), then the numbers the detail
    does not already say."""
    return "; ".join(p for p in (ev.detail or ev.metric, quantities(ev, ev.detail)) if p)


def evidence_cell(f: findings_pb2.Finding) -> str:
    """The findings table's EVIDENCE: the primary evidence (else the summary), and how much more."""
    line = evidence_line(f.evidence) or f.summary
    if f.supporting:
        line += f" (+{len(f.supporting)} supporting)"
    return line


def status_marks(f: findings_pb2.Finding) -> list[str]:
    """ "acked by alice", "silenced (s-123)": what operators have done about the finding."""
    marks = []
    if f.HasField("ack"):
        marks.append(f"acked by {f.ack.by or 'someone'}")
    if f.silenced_by:
        marks.append(f"silenced ({f.silenced_by})")
    return marks


def remediation_cell(f: findings_pb2.Finding) -> str:
    return f.remediation or "-"


def _heading(f: findings_pb2.Finding, severity: str, cause: str) -> Text:
    where = f"{f.node} GPU {f.gpu}" if f.HasField("gpu") else f"{f.node} (node)"
    state = ", ".join(p for p in (severity, "" if f.active else "resolved") if p)
    heading = plain(f"{where} {cause or '-'}" + (f" ({state})" if state else ""), style="bold")
    if f.summary:
        heading.append_text(plain(f": {f.summary}"))
    return heading


def finding_detail(f: findings_pb2.Finding, severity: str, cause: str) -> Text:
    """Every line an operator needs about one finding: its evidence, supporting evidence, the
    remediation and its ack or silence, indented under a heading."""
    lines = [_heading(f, severity, cause)]
    if f.HasField("evidence"):
        lines.append(plain(f"  evidence: {evidence_line(f.evidence) or '-'}"))
    lines += [plain(f"  supporting: {evidence_line(ev) or '-'}") for ev in f.supporting]
    if f.remediation:
        lines.append(plain(f"  remediation: {f.remediation}"))
    if f.HasField("ack"):
        comment = f": {f.ack.comment}" if f.ack.comment else ""
        when = f" at {f.ack.time.ToJsonString()}" if f.ack.HasField("time") else ""
        lines.append(plain(f"  acked by {f.ack.by or 'someone'}{when}{comment}"))
    if f.silenced_by:
        lines.append(plain(f"  silenced ({f.silenced_by})"))
    return Text("\n").join(lines)


def findings_detail(findings: Sequence[findings_pb2.Finding]) -> list[Text]:
    """The node view's section: a title and one block per finding (nothing when there are none)."""
    if not findings:
        return []
    blocks = [
        finding_detail(f, _named(severity_name, f.severity), _named(cause_name, f.cause)) for f in findings
    ]
    return [Text("Evidence and remediation", style="bold"), *blocks]
