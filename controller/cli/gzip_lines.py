"""The lines of a gzip-compressed recording, member by member, past damage.

A recording whose name ends .gz is written as one gzip member a batch of lines (record_lines.py):
the members follow each other, as `cat a.gz b.gz` makes a valid gzip file. A full disk or a crash
can cut a member short and later batches be appended after it; gzip's own reader then stops at the
cut (or reads garbage on). Here each member's text is kept until the member ends with its CRC
checked, so a damaged member gives no lines, not garbage ones (but for a member larger than
HOLD_BYTES): its bytes are counted (`Damage`) and the reading goes on from the next member's header
found after the damaged one's start.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

MAGIC = b"\x1f\x8b\x08"  # a gzip member's first bytes (ID1, ID2, deflate)
CHUNK = 1 << 20
# A member's text held back until its end at most: ours are a batch of lines (~3 MB of JSON); past
# this (one member for a whole file gzip made of a recording) its whole lines go on as decoded.
HOLD_BYTES = 64 << 20
KEEP_BYTES = 4 * CHUNK  # a member's compressed bytes kept for a resync: its last ones


@dataclass(slots=True)
class Damage:
    parts: int = 0  # damaged or cut-short members skipped
    bytes: int = 0  # their compressed bytes


def recording_lines(
    raw: IO[bytes], damage: Damage, counted: Callable[[int], object] = lambda n: None
) -> tuple[bool, Iterator[bytes]]:
    """Whether `raw` (at its start) holds gzip data, and its lines (gzip_lines' if it does; counted(n)
    then for the compressed bytes read, else nothing counted). Its first bytes are read, not peeked
    at or sought back to: a pipe's first read may bring fewer."""
    head = raw.read(len(MAGIC))
    if head == MAGIC:
        return True, gzip_lines(_Prefixed(head, raw), damage, counted)
    return False, _plain(head, raw)


def _plain(head: bytes, raw: IO[bytes]) -> Iterator[bytes]:
    if head:
        yield from io.BytesIO(head + raw.readline())  # (the head may hold a line's end)
        yield from raw


class _Prefixed:
    """`raw` with `head`, already read from it, in front."""

    def __init__(self, head: bytes, raw: IO[bytes]) -> None:
        self.head, self.raw = head, raw

    def read(self, n: int) -> bytes:
        head, self.head = self.head, b""
        return head + self.raw.read(max(0, n - len(head))) if head else self.raw.read(n)


def gzip_lines(
    raw: IO[bytes] | _Prefixed, damage: Damage, counted: Callable[[int], object] = lambda n: None
) -> Iterator[bytes]:
    """The lines of every undamaged member of `raw`, in order (each ending with a newline but perhaps
    the file's last); counted(n) for each n compressed bytes read (progress)."""
    for text in _members(_Counting(raw, counted), damage):
        lines = text.split(b"\n")
        last = lines.pop()  # b"" after a final newline
        for line in lines:
            yield line + b"\n"
        if last:
            yield last


class _Counting:
    def __init__(self, raw: IO[bytes] | _Prefixed, counted: Callable[[int], object]) -> None:
        self.raw, self.counted = raw, counted

    def read(self, n: int) -> bytes:
        data = self.raw.read(n)
        self.counted(len(data))
        return data


def _members(raw: _Counting, damage: Damage) -> Iterator[bytes]:
    pending = b""  # compressed bytes read but not yet fed
    while True:
        if not pending:
            pending = raw.read(CHUNK)
            if not pending:
                return
        member = bytearray()  # this member's last compressed bytes, for a resync if it is damaged
        trimmed = 0  # its bytes before those (a large member's: the next header follows the damage)
        text = bytearray()
        decompressor = zlib.decompressobj(wbits=31)
        ok = False
        while True:
            member += pending
            if len(member) > KEEP_BYTES:
                trimmed += len(member) - KEEP_BYTES
                del member[: len(member) - KEEP_BYTES]
            try:
                text += decompressor.decompress(pending)
            except zlib.error:  # bad data, or the CRC or length at its end does not match
                break
            if decompressor.eof:
                rest = decompressor.unused_data
                del member[len(member) - len(rest) :]
                pending, ok = rest, True
                break
            if len(text) > HOLD_BYTES:
                whole = text.rfind(b"\n") + 1
                yield bytes(text[:whole])
                del text[:whole]
            pending = raw.read(CHUNK)
            if not pending:  # cut short at the file's end
                break
        if ok:
            yield bytes(text)
            continue
        # Damaged: skip to the next member's header after this one's start.
        after = member.find(MAGIC, 0 if trimmed else 1)
        while after < 0:
            more = raw.read(CHUNK)
            if not more:
                damage.parts += 1
                damage.bytes += trimmed + len(member)
                return
            keep = len(MAGIC) - 1  # (a header may begin in the bytes read before)
            trimmed += len(member) - keep
            member = member[-keep:] + more
            after = member.find(MAGIC)
        damage.parts += 1
        damage.bytes += trimmed + after
        pending = bytes(member[after:])


__all__ = ["Damage", "gzip_lines", "recording_lines"]
