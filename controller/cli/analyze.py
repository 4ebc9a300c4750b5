"""`gpufleet analyze`: the controller's detectors, offline, over a recording (gpufleet record,
controller --record), its messages replayed in order of receive time as they are read
(recording_file.py), with progress on stderr every PROGRESS_SECONDS."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

from controller.cli.output import DOCUMENT_FORMATS, print_document
from controller.cli.recording_file import (
    REORDER_WINDOW,
    OutOfOrder,
    RecordingStats,
    in_order,
    received_seconds,
)

if TYPE_CHECKING:
    from controller.config import DetectConfig
    from controller.detect.offline import OfflineDetector

PROGRESS_SECONDS = 5.0


def analyze(
    path: str,
    output: str,
    *,
    config: str | None = None,
    window: int | None = REORDER_WINDOW,
    progress_seconds: float = PROGRESS_SECONDS,
) -> int:
    from controller.cli import tables
    from controller.cli.jsonify import finding_to_dict
    from controller.cli.layout import show
    from controller.config import ConfigError, DetectConfig, load
    from controller.operator.wire import finding_to_proto
    from controller.paging import finding_key

    try:
        detect = load(config).detect if config else DetectConfig()
    except ConfigError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return 2
    try:
        try:
            detector, stats = _replay(path, detect, window, progress_seconds)
        except OutOfOrder as exc:
            if not os.path.isfile(path):  # a pipe: what was read cannot be read again
                print(
                    f"gpufleet analyze: {path}: {exc}; save it to a file to have it sorted", file=sys.stderr
                )
                return 2
            print(f"gpufleet analyze: {path}: {exc}: reading it whole to sort it", file=sys.stderr)
            detector, stats = _replay(path, detect, None, progress_seconds)
    except OSError as exc:
        print(f"gpufleet: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the reading thread and its workers are stopped on the way out
        print(f"gpufleet analyze: {path}: interrupted; no findings printed", file=sys.stderr)
        return 130
    for number, why in stats.bad:
        print(f"gpufleet analyze: {path}:{number}: not a recorded message, skipped: {why}", file=sys.stderr)
    if stats.bad_lines > len(stats.bad):
        more = stats.bad_lines - len(stats.bad)
        print(f"gpufleet analyze: ... and {more} more malformed lines", file=sys.stderr)
    stored = sorted(detector.findings.values(), key=finding_key)
    found = [finding_to_proto(s) for s in stored]
    print(_summary(path, stats, detector.skipped, len(detector.passes), stored), file=sys.stderr)
    if output in DOCUMENT_FORMATS:
        print_document({"findings": [finding_to_dict(f) for f in found]}, output)
    else:
        show(tables.findings_table(found, title=f"Findings in {path}", wide=output == "wide"))
    return 0


def _replay(
    path: str, detect: DetectConfig, window: int | None, progress_seconds: float
) -> tuple[OfflineDetector, RecordingStats]:
    """A new OfflineDetector fed the whole recording, and what was counted of it."""
    from controller.detect.offline import OfflineDetector

    detector = OfflineDetector(config=detect)
    stats = RecordingStats()
    began = time.monotonic()
    replayed, shown = 0, began

    def progress() -> None:
        nonlocal shown
        now = time.monotonic()
        if now - shown >= progress_seconds:
            shown = now
            _progress(path, stats, replayed, now - began, len(detector.active))

    for msg in in_order(path, stats, window=window, each_batch=progress):
        detector.message(msg.message, received_seconds(msg))
        replayed += 1
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
