"""How long the demo runs: `--seconds` of the whole fleet streaming, not of its start-up.

Starting N agent processes takes a few seconds of CPU each (imports, the simulator, the first
collection), so on a small machine the last agent of a 24-node demo connects 10-15 s after the
first. Counted from the demo's start, a 20 s run then left a few seconds of the fleet at work
(probe rounds scheduled on idle GPUs, findings held long enough). The clock starts when every
agent has connected, or after AGENTS_WAIT_SECONDS when some never do (the run goes on with those
that did, and says which are missing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("gpufleet.demo")

AGENTS_WAIT_SECONDS = 60.0


@dataclass(slots=True)
class RunClock:
    limit: float | None  # seconds to run with the fleet streaming; None: until stopped
    expected: int  # agents started
    started: float  # monotonic time the demo started
    wait_seconds: float = AGENTS_WAIT_SECONDS
    since: float | None = None  # when the clock started: the fleet streaming, or the wait over

    def saw(self, now: float, connected: int) -> None:
        """`connected` agents are connected at monotonic time `now`."""
        if self.since is not None:
            return
        if connected >= self.expected:
            self.since = now
            log.info("%.0fs: all %d agents connected", now - self.started, self.expected)
        elif now - self.started >= self.wait_seconds:
            self.since = now
            log.warning(
                "%.0fs: only %d of %d agents connected: running with those (see their logs)",
                now - self.started,
                connected,
                self.expected,
            )

    def ran(self, now: float) -> float:
        """Seconds run so far with the fleet streaming."""
        return 0.0 if self.since is None else now - self.since

    def done(self, now: float) -> bool:
        return self.limit is not None and self.since is not None and now - self.since >= self.limit
