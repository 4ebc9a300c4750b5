"""Recording what the controller ingests: the hub's bounded readers, the Record RPC over real gRPC
with a real ingest, and the --record file sink, which never holds back or breaks ingest."""

from __future__ import annotations

import asyncio
import errno
import gzip
import io
import logging
import threading
import time
from pathlib import Path
from typing import IO, Any

import grpc
import pytest
from google.protobuf import json_format

from controller import record_lines
from controller.app import ControllerApp
from controller.errors import RefusedFrame
from controller.metrics import controller_registry
from controller.record_lines import to_json_line
from controller.recording import Accepted, FileSink, RecordHub
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import T0, Clock, config, frame, hello, running_controller


async def read(call: Any) -> operator_pb2.RecordedMessage:
    """The stream's next message; a test that waits for one that never comes fails, not hangs."""
    msg = await asyncio.wait_for(call.read(), 5)
    assert isinstance(msg, operator_pb2.RecordedMessage)
    return msg


def frames_of(msgs: list[operator_pb2.RecordedMessage]) -> list[tuple[str, int]]:
    return [(m.node, m.message.frame.seq) for m in msgs if m.message.WhichOneof("msg") == "frame"]


def test_a_slow_reader_loses_messages_counted_in_dropped_before_and_never_blocks() -> None:
    async def go() -> None:
        hub = RecordHub()
        with hub.subscribe(maxsize=3) as slow, hub.subscribe(node="n2") as only_n2:
            started = time.perf_counter()
            for seq in range(1, 11):
                hub.frame(frame(seq), T0 + seq)  # nobody reads meanwhile: 7 of 10 do not fit
            assert time.perf_counter() - started < 0.5
            hub.frame(frame(1, node="n2"), T0 + 20)
            got = [await asyncio.wait_for(slow.get(), 5) for _ in range(3)]
            assert [(m.message.frame.seq, m.dropped_before) for m in got] == [(1, 0), (2, 0), (3, 0)]
            hub.hello(hello("n3"), T0 + 30)
            after = await asyncio.wait_for(slow.get(), 5)  # the 7 frames and n2's were lost just before it
            assert (after.node, after.message.WhichOneof("msg"), after.dropped_before) == ("n3", "hello", 8)
            assert slow.dropped == 8
            assert after.received.ToNanoseconds() == int((T0 + 30) * 1e9)
            n2 = await asyncio.wait_for(only_n2.get(), 5)
            assert (n2.node, n2.message.frame.seq, n2.dropped_before) == ("n2", 1, 0)
            assert only_n2.dropped == 0
        assert hub.readers == 0  # the block's end unsubscribes

    asyncio.run(go())


def test_record_streams_current_hellos_then_accepted_messages_only() -> None:
    async def go() -> None:
        clock = Clock()
        async with running_controller(config(), clock) as running:
            ingest = running.app.ingest
            await ingest.hello(hello("n1"))
            await ingest.hello(hello("n2", gpus=2))
            assert await ingest.frame("n1", frame(1)) == 1
            async with grpc.aio.insecure_channel(running.address) as channel:
                call = operator_pb2_grpc.OperatorStub(channel).Record(operator_pb2.RecordRequest())
                first = [await read(call) for _ in range(2)]
                assert [
                    (m.node, m.message.hello.boot_id, len(m.message.hello.inventory.gpus)) for m in first
                ] == [
                    ("n1", "b1", 1),
                    ("n2", "b1", 2),
                ]
                assert all(m.received.ToNanoseconds() == int(T0 * 1e9) for m in first)
                clock.now = T0 + 5
                assert await ingest.frame("n1", frame(2)) == 2
                assert await ingest.frame("n1", frame(2)) == 2  # a duplicate: not stored, not recorded
                with pytest.raises(RefusedFrame):  # n2's frame on n1's stream: refused, not recorded
                    await ingest.frame("n1", frame(1, node="n2"))
                await ingest.hello(hello("n3"))
                assert await ingest.frame("n2", frame(1, node="n2")) == 1
                rest = [await read(call) for _ in range(3)]
                assert [(m.node, m.message.WhichOneof("msg")) for m in rest] == [
                    ("n1", "frame"),
                    ("n3", "hello"),
                    ("n2", "frame"),
                ]
                assert frames_of(rest) == [("n1", 2), ("n2", 1)]
                assert rest[0].received.ToNanoseconds() == int((T0 + 5) * 1e9)
                assert rest[0].message.frame.gpus[0].power_watts == 402.0
                call.cancel()
            for _ in range(100):  # the server sees the hang-up and lets go of the reader
                if running.app.recording.readers == 0:
                    break
                await asyncio.sleep(0.01)
            assert running.app.recording.readers == 0

    asyncio.run(go())


def test_record_for_one_node() -> None:
    async def go() -> None:
        async with running_controller(config(), Clock()) as running:
            ingest = running.app.ingest
            await ingest.hello(hello("n1"))
            await ingest.hello(hello("n2"))
            async with grpc.aio.insecure_channel(running.address) as channel:
                call = operator_pb2_grpc.OperatorStub(channel).Record(operator_pb2.RecordRequest(node="n2"))
                assert (await read(call)).node == "n2"
                await ingest.frame("n1", frame(1))
                await ingest.frame("n2", frame(1, node="n2"))
                nxt = await read(call)
                assert (nxt.node, nxt.message.frame.seq) == ("n2", 1)
                call.cancel()

    asyncio.run(go())


async def _ingest_some(app: ControllerApp, frames: int) -> None:
    await app.ingest.hello(hello("n1"))
    for seq in range(1, frames + 1):
        assert await app.ingest.frame("n1", frame(seq)) == seq


def _lines(path: Path) -> list[operator_pb2.RecordedMessage]:
    out = []
    data = path.read_bytes()
    text = gzip.decompress(data).decode() if path.name.endswith(".gz") else data.decode()
    for line in text.splitlines():
        msg = operator_pb2.RecordedMessage()
        json_format.Parse(line, msg)
        out.append(msg)
    return out


def test_controller_record_appends_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "fleet.jsonl"
    path.write_text(to_json_line(Accepted(T0 - 1, "n0", hello=hello("n0")).to_proto()))  # an earlier run's

    async def go() -> None:
        async with running_controller(config(record=str(path)), Clock()) as running:
            await _ingest_some(running.app, 3)
            sink = running.app.record_sink
            assert sink is not None
            _wait(lambda: sink.written == 4)
            page = generate(running.app)
            assert "gpufleet_controller_record_written_total 4.0" in page
            assert "gpufleet_controller_record_dropped_total 0.0" in page

    asyncio.run(go())  # closing the app writes what is queued
    msgs = _lines(path)
    assert [(m.node, m.message.WhichOneof("msg")) for m in msgs] == [("n0", "hello"), ("n1", "hello")] + [
        ("n1", "frame")
    ] * 3
    assert frames_of(msgs) == [("n1", 1), ("n1", 2), ("n1", 3)]
    line = path.read_text().splitlines()[1]
    assert '"boot_id": "b1"' in line and "\n" not in line  # field names as in the .proto, one line


def test_controller_record_to_a_gz_name_appends_gzip_members(tmp_path: Path) -> None:
    """Each batch one gzip member: the file stays a valid gzip file however often it is appended to,
    and its lines are the plain recording's."""
    path = tmp_path / "fleet.jsonl.gz"
    path.write_bytes(
        gzip.compress(to_json_line(Accepted(T0 - 1, "n0", hello=hello("n0")).to_proto()).encode())
    )

    async def go() -> None:
        async with running_controller(config(record=str(path), record_workers=3), Clock()) as running:
            sink = running.app.record_sink
            assert sink is not None and sink.converter.workers == 3 and sink.compressed
            await _ingest_some(running.app, 3)

    asyncio.run(go())
    asyncio.run(go())  # a second run appends (and the controller's record_workers make the lines)
    msgs = _lines(path)  # gzip's own reader, over every member
    assert [(m.node, m.message.WhichOneof("msg")) for m in msgs] == [("n0", "hello")] + (
        [("n1", "hello")] + [("n1", "frame")] * 3
    ) * 2
    assert frames_of(msgs) == [("n1", 1), ("n1", 2), ("n1", 3)] * 2
    assert path.read_bytes().count(b"\x1f\x8b\x08") >= 3  # members: the first, and one a batch at least


def test_a_cut_line_is_ended_before_appending_but_a_gz_file_is_left_as_it_is(tmp_path: Path) -> None:
    from controller.recording import open_recording

    plain, packed = tmp_path / "cut.jsonl", tmp_path / "cut.jsonl.gz"
    plain.write_bytes(b'{"received": "2026')
    cut = gzip.compress(b'{"node": "n"}\n')[:-5]  # a member cut short: skipped when read
    packed.write_bytes(cut)
    for path in (plain, packed):
        open_recording(str(path)).close()
    assert plain.read_bytes() == b'{"received": "2026\n'
    assert packed.read_bytes() == cut


class FullDisk(io.BytesIO):
    """A file on a disk that fills up: writes fail while `full` is set."""

    def __init__(self, full: threading.Event, lines: list[str]) -> None:
        super().__init__()
        self.full = full
        self.lines = lines

    def write(self, b: Any) -> int:
        if self.full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        self.lines.append(bytes(b).decode("utf-8"))
        return len(bytes(b))


def test_file_sink_survives_a_full_disk_and_resumes(caplog: pytest.LogCaptureFixture) -> None:
    full = threading.Event()
    full.set()
    lines: list[str] = []
    now = [0.0]

    def opener(path: str) -> IO[bytes]:
        return FullDisk(full, lines)

    sink = FileSink("disk.jsonl", opener=opener, retry_seconds=5.0, clock=lambda: now[0])
    sink.start()
    caplog.set_level(logging.INFO, "gpufleet.controller.recording")
    try:
        for seq in range(1, 4):
            sink.offer(Accepted(T0, "n1", frame=frame(seq)))
        _wait(lambda: sink.dropped == 3)  # the first fails; the next two fall in the retry pause
        full.clear()
        sink.offer(Accepted(T0, "n1", frame=frame(4)))
        _wait(lambda: sink.dropped == 4)  # still within the pause: lost, not retried yet
        now[0] = 10.0
        sink.offer(Accepted(T0, "n1", frame=frame(5)))
        _wait(lambda: sink.written == 1)
    finally:
        sink.close()
    assert sink.dropped == 4 and len(lines) == 1
    assert '"seq": "5"' in lines[0]  # uint64: a string in the JSON mapping
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "No space left on device" in errors[0].getMessage()
    assert any("resumed" in r.getMessage() and "4 messages" in r.getMessage() for r in caplog.records)


def test_an_unwritable_record_file_loses_recording_not_telemetry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "no-such-dir" / "fleet.jsonl"

    async def go() -> None:
        async with running_controller(config(record=str(path)), Clock()) as running:
            await _ingest_some(running.app, 5)  # every frame stored and acked all the same
            assert running.app.ingest.counters.frames == 5
            sink = running.app.record_sink
            assert sink is not None
            _wait(lambda: sink.dropped == 6)
            page = generate(running.app)
            assert "gpufleet_controller_record_dropped_total 6.0" in page

    caplog.set_level(logging.ERROR, "gpufleet.controller.recording")
    asyncio.run(go())
    assert not path.exists()
    assert len([r for r in caplog.records if "recording to" in r.getMessage()]) == 1


def test_a_record_file_that_cannot_be_written_is_said_at_start_and_a_good_one_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the file was first opened with the first message: a controller started with a
    mistyped --record said nothing until an agent connected."""
    caplog.set_level(logging.ERROR, "gpufleet.controller.recording")
    bad = FileSink(str(tmp_path / "no-such-dir" / "fleet.jsonl"))
    good = FileSink(str(tmp_path / "fleet.jsonl"))
    for sink in (bad, good):
        sink.start()
    try:
        _wait(lambda: any("recording to" in r.getMessage() for r in caplog.records))
        _wait((tmp_path / "fleet.jsonl").exists)
    finally:
        bad.close()
        good.close()
    [error] = [r.getMessage() for r in caplog.records]
    assert error.startswith(f"recording to {tmp_path / 'no-such-dir' / 'fleet.jsonl'} failed: No such file")
    assert bad.dropped == 0  # nothing was offered: nothing lost


def test_the_dropped_metric_is_zero_without_a_record_file() -> None:
    async def go() -> None:
        async with running_controller(config(), Clock()) as running:
            assert running.app.record_sink is None
            page = generate(running.app)
            assert "gpufleet_controller_record_written_total 0.0" in page
            assert "gpufleet_controller_record_dropped_total 0.0" in page
            assert "gpufleet_controller_record_paused 0.0" in page

    asyncio.run(go())


def generate(app: ControllerApp) -> str:
    from prometheus_client import generate_latest

    return generate_latest(controller_registry(app)).decode()


def _wait(done: object, timeout: float = 5.0) -> None:
    assert callable(done)
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_record_messages_are_shared_not_copied_on_publish() -> None:
    hub = RecordHub()
    msg = frame(1)
    got: list[Accepted] = []

    class Reader:
        node = ""

        def offer(self, item: Accepted) -> None:
            got.append(item)

    hub.add(Reader())
    hub.frame(msg, T0)
    assert got[0].frame is msg  # no copy on the ingest path; the reader converts
    assert got[0].to_proto().message.frame == msg
    assert isinstance(got[0].to_proto().message, pb.AgentMessage)


def test_the_file_sink_s_lines_are_made_out_of_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JSON mapping runs in the converter's workers, never on the controller's own interpreter
    (where it took the event loop's time): here it would raise."""

    def not_here(payloads: object) -> str:
        raise AssertionError("a line was made in the controller's process")

    monkeypatch.setattr(record_lines, "json_lines", not_here)
    path = tmp_path / "fleet.jsonl"
    sink = FileSink(str(path))
    sink.start()
    accepted = [Accepted(T0, "n1", hello=hello("n1"))] + [
        Accepted(T0 + s, "n1", frame=frame(s)) for s in range(1, 150)
    ]
    for item in accepted:
        sink.offer(item)
    sink.close()
    assert sink.written == 150 and sink.dropped == 0 and sink.converter.fallbacks == 0
    assert path.read_text() == "".join(to_json_line(a.to_proto()) for a in accepted)


def test_a_recording_is_its_writer_s_alone_while_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, two recorders on one file (a `gpufleet record` started twice, or one beside the
    controller's --record) appended every message twice. The second is told, and a controller's
    sink tries again later, as for any write error."""
    from controller.recording import IN_USE, open_recording

    path = str(tmp_path / "fleet.jsonl")
    first = open_recording(path)
    with pytest.raises(OSError, match=r"being written by another recorder") as refused:
        open_recording(path)
    assert refused.value.strerror == IN_USE
    caplog.set_level(logging.ERROR, "gpufleet.controller.recording")
    sink = FileSink(path)
    sink.start()
    try:
        _wait(lambda: any(IN_USE in r.getMessage() for r in caplog.records))
    finally:
        sink.close()
        first.close()
    open_recording(path).close()  # free again once its writer closed it
