"""Where the agent's stream to the controller stands, as its /metrics page shows it
(agent/exporter/stream_families.py): read from the exporter's thread while the stream runs on the
agent's event loop, so it is a copy of plain values, taken at once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamStatus:
    controller: str  # the address the agent streams to
    connected: bool  # the controller accepted the stream and it is open
    last_ack_time: float | None  # Unix time of the latest ack received (None: none yet)
    spooled: int  # frames waiting for the controller's ack
    max_frames: int  # what the spool holds before it drops the oldest
    on_disk: bool | None  # new frames reach the spool's directory (None: no directory)
    dropped: int  # frames dropped since start because the spool was full: telemetry lost
    rejected: int  # frames set aside since start: refused by the controller for good, or unsendable
