"""Recording leaves the disk to the store: `controller --record` pauses while the recording's
filesystem has less than `record_min_free_bytes` free.

A recording grows by ~4.5 KB a frame compressed, ~43 KB as plain JSON Lines (an hour of a
12,500-node fleet: ~20 GB or ~190 GB), and the chart puts it on the controller's volume, beside the
SQLite store. Let it fill that disk and the store's writes fail: frames go unacked and telemetry is
what is lost. So before each batch the writer asks this guard (which looks at the filesystem at most
every CHECK_SECONDS): below the reserve the batch is not written, its messages are counted lost
(gpufleet_controller_record_dropped_total), one warning is logged; once there is RESUME_SHARE more
than the reserve free again, recording resumes with one more line saying how many were lost.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("gpufleet.controller.recording")
CHECK_SECONDS = 1.0
RESUME_SHARE = 1.1  # free space over the reserve that resumes a paused recording (no flapping)


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path` (or its folder)."""
    folder = os.path.dirname(os.path.abspath(path))
    stats = os.statvfs(path if os.path.exists(path) else folder)
    return stats.f_bavail * stats.f_frsize


class SpaceGuard:
    def __init__(
        self,
        path: str,
        min_free: int,
        *,
        free: Callable[[str], int] = free_bytes,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.min_free = min_free
        self.paused = False
        self.lost_while_paused = 0
        self._free = free
        self._clock = clock
        self._checked_at = -CHECK_SECONDS

    def allows(self, messages: int) -> bool:
        """Whether a batch of `messages` may be written now (if not, they are counted here as lost
        while paused; the caller counts them in its dropped total)."""
        if self.min_free <= 0:
            return True
        now = self._clock()
        if now - self._checked_at >= CHECK_SECONDS:
            self._checked_at = now
            self._look()
        if self.paused:
            self.lost_while_paused += messages
        return not self.paused

    def _look(self) -> None:
        try:
            free = self._free(self.path)
        except OSError:
            return  # the write itself will say what is wrong with the path
        if not self.paused and free < self.min_free:
            self.paused = True
            log.warning(
                "recording to %s paused: %d MB free on its filesystem, under record_min_free_bytes "
                "(%d MB) that the store needs; messages are not recorded (gpufleet_controller_"
                "record_dropped_total) until there is more room",
                self.path,
                free >> 20,
                self.min_free >> 20,
            )
        elif self.paused and free >= self.min_free * RESUME_SHARE:
            log.warning(
                "recording to %s resumed: %d MB free; %d messages were not recorded while it was paused",
                self.path,
                free >> 20,
                self.lost_while_paused,
            )
            self.paused, self.lost_while_paused = False, 0


__all__ = ["SpaceGuard", "free_bytes"]
