"""`gpufleet analyze`: the controller's detectors, offline, over a recording (gpufleet record,
controller --record), its messages replayed in order of receive time as they are read
(recording_file.py), with progress on stderr every PROGRESS_SECONDS."""

from __future__ import annotations

import heapq
import os
import stat
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from controller.cli import recording_file
from controller.cli.output import DOCUMENT_FORMATS, print_document
from controller.cli.recording_file import (
    PARSE_WORKERS,
    REORDER_WINDOW,
    OutOfOrder,
    RecordingStats,
    in_order,
    received_seconds,
    total,
)
from controller.record_lines import Converter

if TYPE_CHECKING:
    from controller.config import DetectConfig
    from controller.detect.offline import OfflineDetector

PROGRESS_SECONDS = 5.0
MIN_WINDOW = 64  # each of many recordings' reorder window, at least
MIN_BATCH = 16  # lines each of many recordings parses at once, at least


def _once_each(paths: list[str]) -> list[str]:
    """`paths` with a file named twice (`rec.jsonl ./rec.jsonl`, overlapping globs) kept once, said
    on stderr: read twice, its messages were counted twice and its nodes said hello twice."""
    kept: list[str] = []
    seen: dict[tuple[int, int], str] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:  # said when it is read
            kept.append(path)
            continue
        key = (st.st_dev, st.st_ino)
        if key not in seen or not stat.S_ISREG(st.st_mode):  # a pipe or a device: each name is a read
            seen.setdefault(key, path)
            kept.append(path)
            continue
        same = "given twice" if seen[key] == path else f"the same file as {seen[key]}"
        print(f"gpufleet analyze: {path}: {same}: read once", file=sys.stderr)
    return kept


def analyze(
    paths: str | Sequence[str],
    output: str,
    *,
    config: str | None = None,
    window: int | None = REORDER_WINDOW,
    progress_seconds: float = PROGRESS_SECONDS,
) -> int:
    """The detectors over one recording, or several merged in order of receive time (each replica's
    `controller --record` holds its own agents' messages only)."""
    from controller.cli import tables
    from controller.cli.jsonify import finding_to_dict
    from controller.cli.layout import show
    from controller.config import ConfigError, DetectConfig, load
    from controller.operator.wire import finding_to_proto
    from controller.paging import finding_key

    paths = _once_each([paths] if isinstance(paths, str) else list(paths))
    label = paths[0] if len(paths) == 1 else f"{len(paths)} recordings"
    try:
        detect = load(config).detect if config else DetectConfig()
    except ConfigError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return 2
    try:
        try:
            detector, stats = _replay(paths, label, detect, window, progress_seconds)
        except OutOfOrder as exc:
            if not all(os.path.isfile(path) for path in paths):  # a pipe: what was read is gone
                print(f"gpufleet analyze: {exc.path}: {exc}; save it to a file to sort it", file=sys.stderr)
                return 2
            print(f"gpufleet analyze: {exc.path}: {exc}: reading it whole to sort it", file=sys.stderr)
            detector, stats = _replay(paths, label, detect, None, progress_seconds)
    except OSError as exc:
        print(f"gpufleet: cannot read {exc.filename or label}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the reading threads and their workers are stopped on the way out
        print(f"gpufleet analyze: {label}: interrupted; no findings printed", file=sys.stderr)
        return 130
    for path, counted in zip(paths, stats, strict=True):
        for number, why in counted.bad:
            print(
                f"gpufleet analyze: {path}:{number}: not a recorded message, skipped: {why}", file=sys.stderr
            )
        if counted.bad_lines > len(counted.bad):
            more = counted.bad_lines - len(counted.bad)
            print(f"gpufleet analyze: {path}: ... and {more} more malformed lines", file=sys.stderr)
    stored = sorted(detector.findings.values(), key=finding_key)
    found = [finding_to_proto(s) for s in stored]
    print(_summary(label, total(stats), detector.skipped, len(detector.passes), stored), file=sys.stderr)
    unread = [path for path, counted in zip(paths, stats, strict=True) if _unreadable(counted)]
    for path in unread:
        print(f"gpufleet analyze: {path}: no recorded message in it: not a recording?", file=sys.stderr)
    if len(unread) == len(paths):  # nothing to judge: no empty table that looks like a healthy fleet
        return 1
    if output in DOCUMENT_FORMATS:
        print_document({"findings": [finding_to_dict(f) for f in found]}, output)
    else:
        show(tables.findings_table(found, title=f"Findings in {label}", wide=output == "wide"))
    return 0


def _replay(
    paths: list[str], label: str, detect: DetectConfig, window: int | None, progress_seconds: float
) -> tuple[OfflineDetector, list[RecordingStats]]:
    """A new OfflineDetector fed the recordings merged in order of receive time (file order among
    equal times), and what was counted of each."""
    from controller.detect.offline import OfflineDetector

    detector = OfflineDetector(config=detect)
    stats = [RecordingStats() for _ in paths]
    began = time.monotonic()
    replayed, shown = 0, began

    def progress() -> None:
        nonlocal shown
        now = time.monotonic()
        if now - shown >= progress_seconds:
            shown = now
            _progress(label, total(stats), replayed, now - began, len(detector.active))

    # Each recording is read at once (heapq.merge takes the first message of each): the cores, the
    # window and the lines read ahead are shared out among them, so many files (a day of hourly
    # ones) hold what one would.
    n = len(paths)
    workers = max(1, min(PARSE_WORKERS, os.cpu_count() or 1) // n)
    each_window = window if window is None or n == 1 else max(MIN_WINDOW, window // n)
    batch = None if n == 1 else max(MIN_BATCH, recording_file.PARSE_BATCH // n)  # None: PARSE_BATCH
    streams = [
        in_order(
            path, counted, window=each_window, converter=Converter(workers), each_batch=progress, batch=batch
        )
        for path, counted in zip(paths, stats, strict=True)
    ]
    try:
        merged = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=received_seconds)
        for msg in merged:
            detector.message(msg.message, received_seconds(msg))
            replayed += 1
    finally:
        for stream in streams:  # one that raised, or the others after it: their threads stopped
            stream.close()
    detector.finish()
    return detector, stats


def _progress(path: str, stats: RecordingStats, replayed: int, seconds: float, active: int) -> None:
    of = (
        f" of {_size(stats.size)} ({100 * min(stats.read, stats.size) / stats.size:.0f}%)"
        if stats.size
        else ""  # a pipe has no size
    )
    print(
        f"gpufleet analyze: {path}: {_size(stats.read)}{of} read in "
        f"{seconds:.0f} s, {replayed} of {stats.messages} messages replayed, {active} findings active",
        file=sys.stderr,
        flush=True,
    )


def _size(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.0f} MB" if n >= 1e7 else f"{n / 1e6:.1f} MB"


def _unreadable(stats: RecordingStats) -> bool:
    """Something was there, and none of it a recorded message (an empty file is a quiet recording)."""
    return stats.messages == 0 and (stats.bad_lines > 0 or stats.damage.parts > 0)


def _summary(path: str, stats: RecordingStats, skipped: int, passes: int, stored: list[Any]) -> str:
    active = sum(1 for s in stored if s.active)
    parts = [
        f"gpufleet analyze: {path}: {stats.messages} messages ({stats.hellos} hellos, "
        f"{stats.frames} frames) from {len(stats.nodes)} nodes over {stats.span():.0f} s",
        f"{passes} detection passes",
        f"{len(stored)} findings ({active} active at the end)",
    ]
    if stats.bad_lines:
        parts.append(f"{stats.bad_lines} malformed lines skipped")
    if skipped:
        parts.append(f"{skipped} frames skipped (no Hello of their node before them)")
    if stats.dropped:
        parts.append(f"{stats.dropped} messages lost while recording (the recorder fell behind)")
    if stats.damage.parts:
        parts.append(
            f"{stats.damage.parts} damaged or cut-short compressed parts skipped "
            f"({stats.damage.bytes} bytes; their messages are lost)"
        )
    return "; ".join(parts)


__all__ = ["analyze"]
