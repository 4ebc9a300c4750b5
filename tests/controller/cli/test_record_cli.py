"""`gpufleet analyze` over recordings of a simulated fleet (the same findings a live controller
raises from the same messages), and `gpufleet record` against a real controller on loopback."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from agent.sources.sim import FaultSpec
from controller.app import ControllerApp
from controller.cli import analyze as analyze_module
from controller.cli import recording_file
from controller.cli.analyze import analyze
from controller.cli.jsonify import finding_to_dict
from controller.cli.recording_file import REORDER_WINDOW
from controller.config import DetectConfig
from controller.detect.offline import OfflineDetector
from controller.main import main
from controller.operator.wire import finding_to_proto
from controller.record_lines import Converter, to_json_line
from controller.recording import Accepted
from protos.gpufleet.v1 import operator_pb2
from tests.controller.harness import Clock, ControllerThread, config, frame, hello
from tests.simfleet import SimFleet

Capture = pytest.CaptureFixture[str]
DETECT = {"interval_seconds": 2.0, "throttle_window_seconds": 5.0}
START = 1_800_000_000.0


def simulated(faults: dict[str, list[FaultSpec]], nodes: int = 6, seconds: int = 14) -> list[Accepted]:
    """What a controller would accept from simulated agents: each node's Hello, then a frame from
    every node each second (probe results in the first)."""
    sim = SimFleet(nodes, faults, start=START)
    out = [Accepted(sim.now, name, hello=sim.hello(name)) for name in sim.sims]
    for step in range(seconds):
        sim.now += 1.0
        out += [Accepted(sim.now, n, frame=sim.frame(n, probes=step == 0)) for n in sim.sims]
    return out


def write(path: Path, messages: list[Accepted], *, shuffle: bool = False) -> Path:
    lines = [to_json_line(m.to_proto()) for m in messages]
    if shuffle:  # analyze orders by receive time, not by line
        lines = lines[1::2] + lines[::2]
    path.write_text("".join(lines))
    return path


def analyze_json(path: Path, capsys: Capture, *extra: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["analyze", str(path), "-o", "json", *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out)["findings"] if code == 0 else [], err


def config_file(tmp_path: Path) -> str:
    path = tmp_path / "controller.yaml"
    path.write_text(json.dumps({"detect": DETECT}))  # JSON is YAML
    return str(path)


def test_analyze_finds_the_fault_as_the_live_controller_does(tmp_path: Path, capsys: Capture) -> None:
    messages = simulated({"node-03": [FaultSpec("thermal_throttle", 2)]})
    path = write(tmp_path / "rec.jsonl", messages, shuffle=True)
    code, found, err = analyze_json(path, capsys, "--config", config_file(tmp_path))
    assert code == 0, err
    assert {(f["node"], f["gpu"], f["cause"]) for f in found} == {("node-03", 2, "thermal_throttle")}
    assert all(f["active"] for f in found)
    assert "90 messages (6 hellos, 84 frames) from 6 nodes over 14 s" in err
    live = asyncio.run(live_findings(messages))
    assert {(f["node"], f["gpu"], f["cause"], f["severity"], f["first_seen"]) for f in found} == live


async def live_findings(messages: list[Accepted]) -> set[tuple[str, int | None, str, str, str]]:
    """The same messages through a real ControllerApp's ingest, passes at the times analyze ran them."""
    offline = OfflineDetector(config=DetectConfig(**DETECT))  # type: ignore[arg-type]
    for m in messages:
        offline.message(m.to_proto().message, m.received)
    offline.finish()
    passes = [p.time for p in offline.passes]
    clock = Clock(START)
    app = ControllerApp(config(detect=DetectConfig(**DETECT)), clock=clock)  # type: ignore[arg-type]
    await app.start()
    try:
        for m in messages:
            while passes and passes[0] <= m.received:
                clock.now = passes.pop(0)
                await app.detection_pass()
            clock.now = m.received
            if m.hello is not None:
                await app.ingest.hello(m.hello)
            else:
                assert m.frame is not None
                await app.ingest.frame(m.node, m.frame)
        for t in passes:
            clock.now = t
            await app.detection_pass()
        dicts = [finding_to_dict(finding_to_proto(s)) for s in app.active.values()]
    finally:
        app.close()
    return {(f["node"], f["gpu"], f["cause"], f["severity"], f["first_seen"]) for f in dicts}


def test_analyze_of_a_healthy_fleet_finds_nothing(tmp_path: Path, capsys: Capture) -> None:
    path = write(tmp_path / "rec.jsonl", simulated({}, nodes=8, seconds=20))
    code, found, err = analyze_json(path, capsys, "--config", config_file(tmp_path))
    assert (code, found) == (0, []), err


def test_analyze_includes_resolved_findings_and_prints_a_table(tmp_path: Path, capsys: Capture) -> None:
    faulty = simulated({"node-01": [FaultSpec("power_cap", 0)]}, seconds=12)
    healed = simulated({}, seconds=12)  # the same fleet, fixed: frames go on 12 s later
    later = [Accepted(m.received + 12, m.node, frame=m.frame) for m in healed if m.frame is not None]
    for m in later:
        assert m.frame is not None
        m.frame.seq += 12
        m.frame.time.FromNanoseconds(m.frame.time.ToNanoseconds() + 12 * 10**9)
    path = write(tmp_path / "rec.jsonl", faulty + later)
    code, found, err = analyze_json(path, capsys, "--config", config_file(tmp_path))
    assert code == 0, err
    assert [(f["node"], f["cause"], f["active"]) for f in found] == [("node-01", "power_cap", False)]
    assert "1 findings (0 active at the end)" in err
    assert main(["analyze", str(path), "--config", config_file(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "node-01" in out and "power_cap" in out and "resolved" in out


def test_analyze_skips_malformed_lines_naming_them(tmp_path: Path, capsys: Capture) -> None:
    path = write(tmp_path / "rec.jsonl", simulated({"node-03": [FaultSpec("thermal_throttle", 2)]}))
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(3, '{"received": "2027-01-15T08:00:00Z", "node": "n", "mess\n')  # cut short by a full disk
    lines.insert(5, '{"received": "2027-01-15T08:00:00Z", "node": "n"}\n')  # no message
    lines.insert(7, "\n")  # blank lines are no error
    path.write_text("".join(lines))
    code, found, err = analyze_json(path, capsys, "--config", config_file(tmp_path))
    assert code == 0
    assert {(f["node"], f["cause"]) for f in found} == {("node-03", "thermal_throttle")}
    assert f"{path}:4: not a recorded message, skipped" in err
    assert f"{path}:6: not a recorded message, skipped: the message is neither a hello nor a frame" in err
    assert "2 malformed lines skipped" in err


def test_analyze_of_a_file_that_holds_no_recorded_message_fails_naming_it(
    tmp_path: Path, capsys: Capture
) -> None:
    """A file with nothing readable in it (the wrong file, a recording damaged throughout) is no
    quiet fleet: exit 1, no empty table; beside a readable recording it is named and the rest read.
    An empty file is a recording of nothing."""
    wrong = tmp_path / "notes.txt"
    wrong.write_text("this is not\na recording\n")
    damaged = tmp_path / "rec.jsonl.gz"
    damaged.write_bytes(b"\x1f\x8b\x08garbage")  # a gzip header, then nothing gzip can read
    for path in (wrong, damaged):
        assert main(["analyze", str(path), "-o", "json"]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err.rstrip().endswith(f"gpufleet analyze: {path}: no recorded message in it: not a recording?")
    good = write(tmp_path / "rec.jsonl", simulated({"node-03": [FaultSpec("thermal_throttle", 2)]}))
    assert main(["analyze", str(good), str(wrong), "-o", "json", "--config", config_file(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert {(f["node"], f["cause"]) for f in json.loads(out)["findings"]} == {("node-03", "thermal_throttle")}
    assert f"{wrong}: no recorded message in it" in err and f"{good}: no recorded" not in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["analyze", str(empty), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"findings": []}


def test_analyze_sorts_a_recording_out_of_order_beyond_its_window(tmp_path: Path, capsys: Capture) -> None:
    """Lines far from their receive order (two files joined, a clock stepped back) are read again and
    sorted whole: the same findings as from the lines in order, and a note on stderr."""
    messages = simulated({"node-03": [FaultSpec("thermal_throttle", 2)]})
    in_order = write(tmp_path / "in_order.jsonl", messages)
    shuffled = write(tmp_path / "shuffled.jsonl", messages, shuffle=True)
    config = config_file(tmp_path)
    assert analyze(str(in_order), "json", config=config, window=4) == 0
    expected, err = capsys.readouterr()
    assert "reading it whole" not in err
    assert analyze(str(shuffled), "json", config=config, window=4) == 0
    out, err = capsys.readouterr()
    assert out == expected
    assert json.loads(out)["findings"]
    assert f"{shuffled}: line 46 was received" in err  # the first message, after the odd ones
    assert "(out of order by more than 4 messages): reading it whole to sort it" in err
    assert "90 messages (6 hellos, 84 frames) from 6 nodes over 14 s" in err  # counted once


def test_analyze_shows_progress_and_counts_malformed_lines_past_the_first_ten(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recording_file, "PARSE_BATCH", 4)
    path = write(tmp_path / "rec.jsonl", simulated({}, nodes=4, seconds=3))
    with path.open("a") as f:
        f.write("not json\n" * 13)
    assert analyze(str(path), "json", window=2, progress_seconds=0.0) == 0
    err = capsys.readouterr().err
    shown = re.findall(
        r"MB \((\d+)%\) read in \d+ s, (\d+) of (\d+) messages replayed, 0 findings active", err
    )
    assert len(shown) == 8, err  # one a batch of 4 lines: 29 lines
    assert [int(replayed) for _, replayed, _ in shown] == [2, 6, 10, 14, 14, 14, 14, 14]
    assert int(shown[0][0]) < 100 and shown[-1] == ("100", "14", "16")
    named = [line for line in err.splitlines() if "not a recorded message, skipped" in line]
    assert len(named) == 10 and named[0].startswith(f"gpufleet analyze: {path}:17: ")
    assert f"gpufleet analyze: {path}: ... and 3 more malformed lines" in err
    assert "13 malformed lines skipped" in err


def test_analyze_reads_a_compressed_recording_past_a_cut_short_part(tmp_path: Path, capsys: Capture) -> None:
    """A recording named .gz (gzip members, one a batch) gives what the plain one gives; a member cut
    short by a full disk, batches appended after it, loses that batch's messages only, and says so."""
    messages = [m.to_proto() for m in simulated({"node-03": [FaultSpec("thermal_throttle", 2)]})]
    config = config_file(tmp_path)
    plain = tmp_path / "rec.jsonl"
    plain.write_bytes(b"".join(Converter(0).lines(messages)))
    members = [b"".join(Converter(0).lines(messages[i : i + 10], compressed=True)) for i in range(0, 90, 10)]
    whole = tmp_path / "rec.jsonl.gz"
    whole.write_bytes(b"".join(members))
    assert main(["analyze", str(plain), "-o", "json", "--config", config]) == 0
    expected, err = capsys.readouterr()
    assert main(["analyze", str(whole), "-o", "json", "--config", config]) == 0
    out, compressed_err = capsys.readouterr()
    assert out == expected and json.loads(out)["findings"]
    assert compressed_err.replace(str(whole), str(plain)) == err
    damaged = tmp_path / "damaged.jsonl.gz"
    damaged.write_bytes(b"".join(members[:8]) + members[8][:-20])  # the last 10 frames cut short
    assert main(["analyze", str(damaged), "-o", "json", "--config", config]) == 0
    err = capsys.readouterr().err
    assert "80 messages (6 hellos, 74 frames)" in err
    assert f"1 damaged or cut-short compressed parts skipped ({len(members[8]) - 20} bytes" in err


def test_analyze_reads_a_pipe_and_says_when_it_cannot_sort_one(tmp_path: Path, capsys: Capture) -> None:
    messages = simulated({"node-03": [FaultSpec("thermal_throttle", 2)]})
    config = config_file(tmp_path)
    in_order, shuffled = (
        write(tmp_path / "a.jsonl", messages),
        write(tmp_path / "b.jsonl", messages, shuffle=True),
    )
    assert analyze(str(in_order), "json", config=config) == 0
    expected = capsys.readouterr().out
    fifo = tmp_path / "fifo"
    for source, window, code in ((in_order, REORDER_WINDOW, 0), (shuffled, 4, 2)):
        os.mkfifo(fifo)
        feeder = threading.Thread(target=lambda src=source: fifo.write_bytes(src.read_bytes()))
        feeder.start()
        try:
            assert analyze(str(fifo), "json", config=config, window=window) == code
        finally:
            feeder.join(timeout=10)
            fifo.unlink()
        out, err = capsys.readouterr()
        if code == 0:
            assert out == expected and "90 messages" in err
        else:
            assert "(out of order by more than 4 messages); save it to a file to sort it" in err


def test_ctrl_c_ends_analyze_with_one_line_and_its_reader_stopped(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "rec.jsonl", simulated({}, nodes=4, seconds=3))
    seen = []

    def interrupted(self: OfflineDetector, message: object, received: float) -> None:
        seen.append(received)
        if len(seen) == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(OfflineDetector, "message", interrupted)
    assert analyze(str(path), "json", window=2) == 130
    out, err = capsys.readouterr()
    assert out == "" and err == f"gpufleet analyze: {path}: interrupted; no findings printed\n"
    assert not [t for t in threading.enumerate() if t.name == "gpufleet-analyze-reader"]


def test_analyze_merges_each_replica_s_recording_in_receive_order(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas' recordings (each its own agents' messages; one compressed, one out of order
    within its window) give what one recording of the whole fleet gives."""
    messages = simulated(
        {"node-03": [FaultSpec("thermal_throttle", 2)], "node-01": [FaultSpec("power_cap", 0)]}
    )
    config = config_file(tmp_path)
    whole = write(tmp_path / "whole.jsonl", messages)
    first = write(tmp_path / "replica-0.jsonl", [m for m in messages if m.node < "node-03"], shuffle=True)
    second = tmp_path / "replica-1.jsonl.gz"
    second.write_bytes(
        b"".join(Converter(0).lines([m.to_proto() for m in messages if m.node >= "node-03"], compressed=True))
    )
    assert main(["analyze", str(whole), "-o", "json", "--config", config]) == 0
    expected, err = capsys.readouterr()
    assert len(json.loads(expected)["findings"]) == 2
    assert main(["analyze", str(first), str(second), "-o", "json", "--config", config]) == 0
    out, merged_err = capsys.readouterr()
    assert out == expected
    assert (
        "gpufleet analyze: 2 recordings: 90 messages (6 hellos, 84 frames) from 6 nodes over 14 s"
        in merged_err
    )
    assert merged_err.split("; ", 1)[1] == err.split("; ", 1)[1]  # passes and findings alike
    # the first out of order beyond a small window: both read again whole, the same findings
    monkeypatch.setattr(analyze_module, "MIN_WINDOW", 1)
    assert analyze([str(first), str(second)], "json", config=config, window=2) == 0
    out, err = capsys.readouterr()
    assert out == expected and f"gpufleet analyze: {first}: line " in err and "reading it whole" in err
    assert main(["analyze", str(first), str(tmp_path / "gone.jsonl")]) == 2
    assert f"cannot read {tmp_path / 'gone.jsonl'}: No such file" in capsys.readouterr().err
    assert not [t for t in threading.enumerate() if t.name == "gpufleet-analyze-reader"]


def test_a_recording_named_twice_is_read_once_and_said(tmp_path: Path, capsys: Capture) -> None:
    """Before, `analyze rec.jsonl ./rec.jsonl` (overlapping globs, say) counted every message
    twice and every node said hello twice."""
    messages = simulated({"node-01": [FaultSpec("power_cap", 0)]})
    config = config_file(tmp_path)
    rec = write(tmp_path / "rec.jsonl", messages)
    assert main(["analyze", str(rec), "-o", "json", "--config", config]) == 0
    once, err_once = capsys.readouterr()
    again = f"{tmp_path}/./rec.jsonl"
    assert main(["analyze", str(rec), again, str(rec), "-o", "json", "--config", config]) == 0
    out, err = capsys.readouterr()
    assert out == once
    assert f"gpufleet analyze: {again}: the same file as {rec}: read once" in err
    assert f"gpufleet analyze: {rec}: given twice: read once" in err
    assert err_once.rsplit("\n", 2)[-2].split(": ", 2)[2] in err  # the one file's counts


def test_many_recordings_share_out_the_window_the_lines_read_ahead_and_the_cores(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """heapq.merge takes the first message of every recording at once: each one's window fills
    before it gives one, so each gets its share (a day of hourly files holds what one file would)."""
    calls: list[dict[str, Any]] = []
    real = recording_file.in_order

    def spy(path: str, stats: Any, **kwargs: Any) -> Any:
        calls.append({"workers": kwargs["converter"].workers, **kwargs})
        return real(path, stats, **kwargs)

    monkeypatch.setattr("controller.cli.analyze.in_order", spy)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    messages = simulated({}, nodes=4, seconds=3)
    paths = [str(write(tmp_path / f"hour-{i}.jsonl", messages[i::5])) for i in range(5)]
    assert analyze(paths, "json") == 0
    assert "16 messages (4 hellos, 12 frames) from 4 nodes" in capsys.readouterr().err
    assert [(c["window"], c["batch"], c["workers"]) for c in calls] == [(4096 // 5, 512 // 5, 1)] * 5
    copies = [str(write(tmp_path / f"copy-{i}.jsonl", messages[::5])) for i in range(20)]
    assert analyze(copies, "json", window=640) == 0  # (20 files: at the window's floor)
    capsys.readouterr()
    assert {(c["window"], c["batch"], c["workers"]) for c in calls[5:]} == {(64, 512 // 20, 1)}


def test_analyze_refuses_a_missing_file_or_a_bad_config(tmp_path: Path, capsys: Capture) -> None:
    assert main(["analyze", str(tmp_path / "none.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("detect: {margin: 2}\n")
    path = write(tmp_path / "rec.jsonl", [])
    assert main(["analyze", str(path), "--config", str(bad)]) == 2
    assert "detect.margin" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["rec.jsonl", "rec.jsonl.gz"])
def test_record_writes_the_stream_until_the_duration(tmp_path: Path, capsys: Capture, name: str) -> None:
    out = tmp_path / name
    with ControllerThread(config(), Clock()) as c:

        async def before(app: ControllerApp) -> None:
            await app.ingest.hello(hello("n1"))
            await app.ingest.hello(hello("n2"))

        c.call(before)
        stop = threading.Event()

        def feed() -> None:  # frames arrive while recording
            seq = 0
            while not stop.is_set() and seq < 50:
                seq += 1

                async def one(app: ControllerApp, seq: int = seq) -> None:
                    await app.ingest.frame("n1", frame(seq))

                c.call(one)
                time.sleep(0.02)

        feeder = threading.Thread(target=feed)
        started = time.monotonic()
        feeder.start()
        try:
            workers = ["--workers", "1"] if name.endswith(".gz") else []  # one process makes them all
            code = main(
                [
                    "record",
                    "--controller",
                    c.address,
                    "--out",
                    str(out),
                    "--duration",
                    "1.5",
                    "-o",
                    "json",
                    *workers,
                ]
            )
        finally:
            stop.set()
            feeder.join()
        took = time.monotonic() - started
    assert code == 0
    assert 1.4 < took < 5
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    msgs = []
    data = out.read_bytes()
    if name.endswith(".gz"):  # gzip members, one a batch
        assert data[:2] == b"\x1f\x8b"
        data = gzip.decompress(data)
    for line in data.decode().splitlines():
        msg = operator_pb2.RecordedMessage()
        json_format.Parse(line, msg)
        msgs.append(msg)
    assert [(m.node, m.message.WhichOneof("msg")) for m in msgs[:2]] == [("n1", "hello"), ("n2", "hello")]
    seqs = [m.message.frame.seq for m in msgs[2:]]
    assert seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # in order, none lost
    assert summary["messages"] == len(msgs) and summary["hellos"] == 2 and summary["dropped"] == 0
    assert f"wrote {len(msgs)} messages (2 hellos" in captured.err


def test_record_refuses_a_worker_count_it_cannot_use(tmp_path: Path, capsys: Capture) -> None:
    for workers in ("0", "33"):
        assert main(["record", "--out", str(tmp_path / "r.jsonl"), "--workers", workers]) == 2
        assert "--workers must be between 1 and 32" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


def test_record_refuses_a_negative_duration_instead_of_running_until_ctrl_c(
    tmp_path: Path, capsys: Capture
) -> None:
    for duration in ("-1", "nan"):
        assert main(["record", "--out", str(tmp_path / "r.jsonl"), "--duration", duration]) == 2
        assert "--duration must be a number of seconds >= 0 (0: until Ctrl-C)" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


def test_record_to_a_file_another_recorder_writes_is_refused(tmp_path: Path, capsys: Capture) -> None:
    from controller.recording import open_recording
    from tests.support import free_port

    out = tmp_path / "r.jsonl"
    with open_recording(str(out)):  # another `gpufleet record --out r.jsonl`, say
        code = main(["record", "--out", str(out), "--controller", f"127.0.0.1:{free_port()}"])
    assert code == 1
    assert capsys.readouterr().err == (
        f"gpufleet: cannot write {out}: being written by another recorder (gpufleet record, or a "
        "controller's --record)\n"
    )


def test_record_without_a_controller_says_so(tmp_path: Path, capsys: Capture) -> None:
    from tests.support import free_port

    code = main(["record", "--controller", f"127.0.0.1:{free_port()}", "--out", str(tmp_path / "r.jsonl")])
    assert code == 1
    err = capsys.readouterr().err
    assert "cannot reach controller" in err and "wrote 0 messages" in err


def test_the_controller_record_flag_sets_the_config_key() -> None:
    from controller.cli.run_controller import _overrides
    from controller.config import load
    from controller.main import build_parser

    args = build_parser().parse_args(["controller", "--record", "fleet.jsonl"])
    assert load(None, _overrides(args)).record == "fleet.jsonl"
    assert load(None, _overrides(build_parser().parse_args(["controller"]))).record == ""


@pytest.mark.skipif(
    not Path("/dev/full").exists(), reason="needs /dev/full (Linux): a disk that is always full"
)
def test_record_to_a_full_disk_ends_with_one_clear_line(capsys: Capture) -> None:
    with ControllerThread(config(), Clock()) as c:

        async def before(app: ControllerApp) -> None:
            await app.ingest.hello(hello("n1"))

        c.call(before)
        started = time.monotonic()
        code = main(["record", "--controller", c.address, "--out", "/dev/full", "--duration", "30"])
        took = time.monotonic() - started
    assert code == 1
    err = capsys.readouterr().err
    assert "gpufleet: cannot write /dev/full: No space left on device" in err
    assert "wrote 0 messages" in err
    assert took < 20  # ended by the error, not by --duration


def test_the_summary_says_why_messages_were_dropped_only_when_some_were(capsys: Capture) -> None:
    from controller.cli.record import Tally, _record_summary

    tally = Tally()
    for node, dropped in (("n1", 0), ("n2", 3)):
        msg = operator_pb2.RecordedMessage(node=node, dropped_before=dropped)
        msg.message.hello.node = node
        tally.add(msg)
    _record_summary("r.jsonl", "table", tally)
    assert "wrote 2 messages (2 hellos, 0 frames, 2 nodes) to r.jsonl" in (err := capsys.readouterr().err)
    assert "; 3 dropped (read too slowly: the controller's queue for this reader overflowed)" in err
    _record_summary("r.jsonl", "table", Tally())
    err = capsys.readouterr().err
    assert err.rstrip().endswith("; 0 dropped"), err
