"""A recording read back for gpufleet analyze: in order of receive time through a bounded window,
parsed in the converter's workers a few batches ahead, malformed lines counted, and the reading
thread and its workers ended however the replay ends."""

from __future__ import annotations

import math
import threading
from collections.abc import Generator, Sequence
from pathlib import Path

import pytest

from controller import record_lines
from controller.cli import recording_file
from controller.cli.recording_file import ERRORS_SHOWN, OutOfOrder, RecordingStats, in_order, received_seconds
from controller.record_lines import Converter, to_json_line
from controller.recording import Accepted
from protos.gpufleet.v1 import operator_pb2
from tests.controller.harness import T0, frame, hello


def _messages(n: int, *, node: str = "n2") -> list[operator_pb2.RecordedMessage]:
    out = [Accepted(T0, "nœud-1 ☃", hello=hello("nœud-1 ☃")).to_proto()]
    for seq in range(1, n):
        f = frame(seq, node)
        f.gpus[0].power_watts = math.nan if seq % 3 == 0 else -0.0
        out.append(Accepted(T0 + seq, node, frame=f).to_proto(dropped_before=seq % 2))
    return out


def _write(
    path: Path, messages: Sequence[operator_pb2.RecordedMessage], extra: dict[int, bytes] | None = None
) -> str:
    """The messages as a recording, with `extra` lines inserted before the message at each index."""
    lines = [to_json_line(m).encode("utf-8") for m in messages]
    for at, line in sorted((extra or {}).items(), reverse=True):
        lines.insert(at, line)
    path.write_bytes(b"".join(lines))
    return str(path)


def _times(messages: Sequence[operator_pb2.RecordedMessage]) -> list[float]:
    return [received_seconds(m) for m in messages]


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpufleet-analyze-reader"]


def test_near_ordered_lines_come_out_in_receive_order_through_the_window(tmp_path: Path) -> None:
    messages = _messages(60)
    swapped = list(messages)
    for i in range(1, 58, 6):  # each message 3 places from its own: within a window of 4
        swapped[i], swapped[i + 3] = swapped[i + 3], swapped[i]
    stats = RecordingStats()
    out = list(in_order(_write(tmp_path / "rec.jsonl", swapped), stats, window=4, converter=Converter(2)))
    assert _times(out) == sorted(_times(messages))
    assert [m.SerializeToString() for m in out] == [m.SerializeToString() for m in messages]  # NaN and all
    assert (stats.messages, stats.hellos, stats.frames, stats.nodes) == (60, 1, 59, {"nœud-1 ☃", "n2"})
    assert stats.dropped == sum(m.dropped_before for m in messages)
    assert (stats.first, stats.last, stats.span()) == (T0, T0 + 59, 59.0)
    assert stats.read == stats.size == (tmp_path / "rec.jsonl").stat().st_size
    assert not _reader_threads()


def test_the_window_holds_back_no_more_than_its_size(tmp_path: Path) -> None:
    """The first message comes out once window + 1 are read: the rest of the file is not held."""
    path = _write(tmp_path / "rec.jsonl", _messages(3000))
    stats = RecordingStats()
    messages = in_order(path, stats, window=10, converter=Converter(1))
    assert isinstance(messages, Generator)
    first = next(messages)
    assert received_seconds(first) == T0
    assert stats.messages == 11  # counted as the replay takes them: the thread's batches ahead are not
    assert stats.read < stats.size
    messages.close()
    assert not _reader_threads()


def test_a_message_behind_the_window_is_out_of_order(tmp_path: Path) -> None:
    messages = _messages(30)
    late = messages[:2] + messages[3:] + [messages[2]]  # message 2 last: 27 places from its own
    path = _write(tmp_path / "rec.jsonl", late)
    with pytest.raises(
        OutOfOrder,
        match=r"line 30 was received 19\.000 s before a message already replayed \(out of order by more"
        r" than 8 ",
    ):
        list(in_order(path, RecordingStats(), window=8, converter=Converter(1)))
    assert not _reader_threads()
    whole = list(in_order(path, RecordingStats(), window=None, converter=Converter(1)))
    assert _times(whole) == sorted(_times(messages))


def test_equal_receive_times_keep_file_order(tmp_path: Path) -> None:
    messages = [Accepted(T0, f"n{i}", hello=hello(f"n{i}")).to_proto() for i in range(20)]
    out = list(in_order(_write(tmp_path / "rec.jsonl", messages), RecordingStats(), window=3))
    assert [m.node for m in out] == [f"n{i}" for i in range(20)]


def test_malformed_lines_are_counted_the_first_ones_kept_with_their_reasons(tmp_path: Path) -> None:
    messages = _messages(30)
    bad = {3: b"not json\n", 5: b"\n", 7: b'{"received": "2027-01-15T08:00:00Z", "node": "n"}\n'}
    bad |= {10 + i: b"{}\n" for i in range(12)}  # 12 more: only ERRORS_SHOWN named in all
    stats = RecordingStats()
    out = list(in_order(_write(tmp_path / "rec.jsonl", messages, bad), stats, converter=Converter(2)))
    assert len(out) == 30
    assert stats.bad_lines == 14  # the blank line is no error
    assert len(stats.bad) == ERRORS_SHOWN
    assert stats.bad[0][0] == 4 and stats.bad[0][1]
    assert stats.bad[1] == (10, "the message is neither a hello nor a frame")
    assert stats.bad[2] == (14, "the message is neither a hello nor a frame")  # {} has no message


def test_lines_are_parsed_out_of_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def not_here(lines: object) -> bytes:
        raise AssertionError("a line was parsed in this process")

    messages = _messages(30)
    path = _write(tmp_path / "rec.jsonl", messages)
    monkeypatch.setitem(record_lines.JOBS, record_lines.PARSE_LINES, not_here)
    converter = Converter(2)
    out = list(in_order(path, RecordingStats(), converter=converter))
    assert [m.SerializeToString() for m in out] == [m.SerializeToString() for m in messages]
    assert converter.fallbacks == 0
    assert all(w is None for w in converter._pool)  # closed with the reading thread


class _FailingConverter(Converter):
    """Parses the first batch, then cannot read on (as a disk error would)."""

    def __init__(self) -> None:
        super().__init__(0)
        self.batches = 0
        self.closed = False

    def parse(self, lines: Sequence[bytes]) -> list[tuple[bool, bytes]]:
        self.batches += 1
        if self.batches > 1:
            raise OSError(5, "Input/output error")
        return super().parse(lines)

    def close(self) -> None:
        self.closed = True
        super().close()


def test_an_error_reading_on_reaches_the_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recording_file, "PARSE_BATCH", 10)
    path = _write(tmp_path / "rec.jsonl", _messages(50))
    converter = _FailingConverter()
    got = []
    with pytest.raises(OSError, match="Input/output error"):
        for msg in in_order(path, RecordingStats(), window=2, converter=converter):
            got.append(msg)
    assert len(got) == 8  # the first batch's 10, less the window's 2 held back
    assert converter.closed and not _reader_threads()


def test_a_file_that_cannot_be_opened_raises_at_once(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        next(in_order(str(tmp_path / "none.jsonl"), RecordingStats()))
    with pytest.raises(IsADirectoryError):
        next(in_order(str(tmp_path), RecordingStats()))
    assert not _reader_threads()
