"""A gzip-compressed recording's lines, member by member: every member's lines in order, and a
member cut short (a full disk, a crash) or damaged skipped and counted, the reading going on at
the next member."""

from __future__ import annotations

import gzip
import io
import os
import threading
import time

import pytest

from controller.cli import gzip_lines
from controller.cli.gzip_lines import Damage, recording_lines


def _member(first: int, n: int) -> bytes:
    return gzip.compress(
        b"".join(b'{"line": %d}\n' % i for i in range(first, first + n)), compresslevel=1, mtime=0
    )


def _read(data: bytes) -> tuple[list[int], Damage]:
    damage = Damage()
    lines = list(gzip_lines.gzip_lines(io.BytesIO(data), damage))
    assert all(line.endswith(b"\n") for line in lines)
    return [int(line[9:-2]) for line in lines], damage


def test_members_one_after_another_are_one_recording() -> None:
    data = _member(0, 5) + _member(5, 3) + _member(8, 100)
    assert _read(data) == (list(range(108)), Damage())
    assert gzip.decompress(data).count(b"\n") == 108  # a valid gzip file, as gzip itself reads it


def test_a_member_cut_short_then_more_appended_loses_only_that_member() -> None:
    cut = _member(5, 40)[:-30]
    data = _member(0, 5) + cut + _member(45, 5)
    assert _read(data) == ([*range(5), *range(45, 50)], Damage(1, len(cut)))
    with pytest.raises((EOFError, OSError)):  # what gzip's own reader makes of it
        gzip.decompress(data)


def test_a_member_cut_short_at_the_end_of_the_file() -> None:
    cut = _member(5, 40)[:-7]
    assert _read(_member(0, 5) + cut) == (list(range(5)), Damage(1, len(cut)))


def test_a_damaged_byte_loses_its_member_not_garbage_lines() -> None:
    middle = bytearray(_member(5, 40))
    middle[len(middle) // 2] ^= 0xFF
    data = _member(0, 5) + bytes(middle) + _member(45, 5)
    assert _read(data) == ([*range(5), *range(45, 50)], Damage(1, len(middle)))


def test_a_large_damaged_member_is_skipped_holding_only_its_last_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gzip_lines, "CHUNK", 64)
    monkeypatch.setattr(gzip_lines, "KEEP_BYTES", 128)  # of a member of ~900 bytes
    large = bytearray(_member(5, 400))
    large[len(large) // 3] ^= 0xFF
    data = _member(0, 5) + bytes(large) + _member(405, 5)
    assert len(large) > 4 * 128
    assert _read(data) == ([*range(5), *range(405, 410)], Damage(1, len(large)))
    cut = _member(5, 400)[:-100]  # cut short at the end, nothing after it
    assert _read(_member(0, 5) + cut) == (list(range(5)), Damage(1, len(cut)))


def test_a_member_larger_than_what_is_held_goes_on_in_whole_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gzip_lines, "HOLD_BYTES", 100)
    monkeypatch.setattr(gzip_lines, "CHUNK", 64)  # fed in small pieces: whole lines before the member ends
    lines, damage = _read(_member(0, 500))
    assert (lines, damage) == (list(range(500)), Damage())


def test_only_gzip_data_is_taken_for_gzip_and_plain_lines_are_kept_whole() -> None:
    compressed, lines = recording_lines(io.BytesIO(_member(0, 2)), Damage())
    assert compressed and list(lines) == [b'{"line": 0}\n', b'{"line": 1}\n']
    for text in (b'{"line": 0}\n{"line": 1}\n', b"{}\n{}\n", b"\n\n{}", b"{", b""):
        compressed, lines = recording_lines(io.BytesIO(text), Damage())
        assert not compressed and list(lines) == io.BytesIO(text).readlines(), text


def test_a_pipe_whose_first_write_is_short_is_still_taken_for_gzip() -> None:
    """Its first bytes are read (a read waits for them), not peeked at: a peek gets what one read of
    the pipe brought, which may be a single byte."""
    data = _member(0, 3)
    read, write = os.pipe()
    os.write(write, data[:1])

    def rest() -> None:
        time.sleep(0.2)
        os.write(write, data[1:])
        os.close(write)

    writer = threading.Thread(target=rest)
    writer.start()
    with open(read, "rb") as piped:
        counted: list[int] = []
        compressed, lines = recording_lines(piped, Damage(), counted.append)
        assert compressed and len(list(lines)) == 3
    writer.join()
    assert sum(counted) == len(data)
