"""A recording's JSON lines are made in worker processes: the same bytes as the protobuf JSON mapping
made here, in order, and nothing lost when a worker dies or hangs."""

from __future__ import annotations

import io
import logging
import math
import os
import signal

import pytest
from google.protobuf import json_format

from controller.record_lines import MAKE_LINES, Converter, _batch, _split, json_lines, serve, to_json_line
from controller.recording import Accepted
from protos.gpufleet.v1 import operator_pb2
from tests.controller.harness import T0, frame, hello


def _messages(n: int) -> list[operator_pb2.RecordedMessage]:
    out = [Accepted(T0, "nœud-1 ☃", hello=hello("nœud-1 ☃")).to_proto()]
    for seq in range(1, n):
        f = frame(seq, "n2")
        f.gpus[0].power_watts = math.nan if seq % 3 == 0 else -0.0
        out.append(Accepted(T0 + seq / 7, "n2", frame=f).to_proto(dropped_before=seq % 2))
    return out


def _expected(messages: list[operator_pb2.RecordedMessage]) -> bytes:
    return "".join(to_json_line(m) for m in messages).encode("utf-8")


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_the_lines_are_the_json_mapping_s_in_order(workers: int) -> None:
    messages = _messages(40)
    converter = Converter(workers)
    try:
        assert b"".join(converter.lines(messages)) == _expected(messages)
        assert b"".join(converter.lines(messages[:1])) == _expected(messages[:1])  # fewer than workers
        assert converter.lines([]) == []
    finally:
        converter.close()
    assert converter.fallbacks == 0
    lines = b"".join(Converter(0).lines(messages)).decode().splitlines()
    back = operator_pb2.RecordedMessage()
    json_format.Parse(lines[3], back)
    assert back == messages[3]  # NaN and all: gpufleet analyze reads it back


def _pids(converter: Converter) -> list[int]:
    return [w.process.pid for w in converter._pool if w is not None]


def test_a_dead_worker_loses_nothing_and_is_started_again(caplog: pytest.LogCaptureFixture) -> None:
    messages = _messages(20)
    converter = Converter(2)
    caplog.set_level(logging.WARNING, "gpufleet.controller.recording")
    try:
        converter.lines(messages)
        first = _pids(converter)
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)
        converter._pool[0].process.wait()  # type: ignore[union-attr]
        assert b"".join(converter.lines(messages)) == _expected(messages)  # its share made here
        assert converter.fallbacks == 1
        assert b"".join(converter.lines(messages)) == _expected(messages)
        again = _pids(converter)
        assert len(again) == 2 and again[0] != first[0] and again[1] == first[1]
    finally:
        converter.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert len([w for w in warnings if "converted on the calling thread" in w]) == 1
    assert any("worker processes again" in w for w in warnings)


def test_a_hung_worker_is_replaced_after_the_answer_time() -> None:
    messages = _messages(6)
    converter = Converter(1, answer_seconds=5.0)  # room for a new worker to start on a busy machine
    try:
        converter.lines(messages)
        (pid,) = _pids(converter)
        os.kill(pid, signal.SIGSTOP)
        assert b"".join(converter.lines(messages)) == _expected(messages)
        assert converter.fallbacks == 1
        assert converter._pool[0] is None  # killed; a new one next batch
        converter.lines(messages)
        (second,) = _pids(converter)
        assert second != pid
        os.kill(second, signal.SIGSTOP)  # and a batch larger than its pipe: the write cannot hang either
        big = [Accepted(T0, "n" * 100_000, frame=frame(s)).to_proto() for s in range(1, 30)]
        assert b"".join(converter.lines(big)) == _expected(big)
        assert converter.fallbacks == 2
    finally:
        converter.close()


def test_workers_end_when_closed() -> None:
    converter = Converter(2)
    converter.lines(_messages(4))
    processes = [w.process for w in converter._pool if w is not None]
    converter.close()
    assert [p.returncode for p in processes] == [0, 0]


def test_a_worker_answers_each_batch_and_ends_with_its_input() -> None:
    payloads = [m.SerializeToString() for m in _messages(5)]
    stdin = io.BytesIO(
        _batch(MAKE_LINES, payloads[:2]) + _batch(MAKE_LINES, payloads[2:]) + _batch(MAKE_LINES, [])
    )
    stdout = io.BytesIO()
    serve(stdin, stdout)
    answer = stdout.getvalue()
    first = int.from_bytes(answer[:4], "little")
    assert answer[4 : 4 + first].decode() == json_lines(payloads[:2])
    rest = answer[4 + first :]
    second = int.from_bytes(rest[:4], "little")
    assert rest[4 : 4 + second].decode() == json_lines(payloads[2:])
    assert rest[4 + second :] == b"\0\0\0\0"  # an empty batch: no lines


def test_split_keeps_order_and_leaves_no_run_empty() -> None:
    items = [bytes([i]) for i in range(7)]
    for n in range(1, 10):
        runs = _split(items, n)
        assert [x for run in runs for x in run] == items
        assert len(runs) == min(n, 7) and all(runs)


BAD_LINES = [b"not json at all\n", b'{"node": "n1", "nope": 1}\n', b'{"node": 5}\n', b"\xff\xfe{}\n"]


def _reason(line: bytes) -> str:
    try:
        json_format.Parse(line.decode("utf-8", errors="replace"), operator_pb2.RecordedMessage())
    except (json_format.ParseError, ValueError) as exc:
        return str(exc).splitlines()[0][:200] if str(exc) else "not JSON"
    raise AssertionError(f"{line!r} parsed")


@pytest.mark.parametrize("workers", [0, 2])
def test_lines_are_parsed_back_with_each_bad_line_s_reason(workers: int) -> None:
    messages = _messages(12)
    lines = [to_json_line(m).encode("utf-8") for m in messages]
    mixed = lines[:3] + BAD_LINES + lines[3:]
    converter = Converter(workers)
    try:
        parsed = converter.parse(mixed)
    finally:
        converter.close()
    assert converter.fallbacks == 0
    assert [ok for ok, _ in parsed] == [True] * 3 + [False] * len(BAD_LINES) + [True] * (len(lines) - 3)
    good = [operator_pb2.RecordedMessage.FromString(data) for ok, data in parsed if ok]
    assert [m.SerializeToString() for m in good] == [m.SerializeToString() for m in messages]  # NaN too
    assert [data.decode() for ok, data in parsed if not ok] == [_reason(b) for b in BAD_LINES]
