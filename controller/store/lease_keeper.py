"""A won lease kept alive from the moment it is won (controller/store/lease.py).

A lease stays held only while it is checked: PostgreSQL ends a session silent for SILENCE_SECONDS
(the lock with it), and a Kubernetes Lease is renewed by the check itself. The server checks the
lead every POLL_SECONDS once it serves, but a controller that has just won the lease first loads the
fleet, catches up and gives its detection process the fleet: 15 s and more at thousands of nodes.
Unchecked that long, the lease was gone by the first check, and the new leader stopped at once
(a failover of 2,000 nodes on two replicas: bench/controller_scale.py --failover).

The checks run from the event loop (in a thread, one at a time), so a controller whose loop hangs
still stops checking and loses the lease, as it should.
"""

from __future__ import annotations

import asyncio
import threading
import time

from controller.store.lease import Lease


class LeaseKeeper:
    """Checks `lease` at least every `poll` seconds until stopped; `alive()` checks it now."""

    def __init__(self, lease: Lease, poll: float) -> None:
        self.lease = lease
        self.poll = poll
        self._last = time.monotonic()  # won just now: as good as a check
        self._held = True
        self._stopped = False
        self._mutex = threading.Lock()  # one call on the lease at a time: its connection is not shared
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def alive(self) -> bool:
        """Check the lease now (a ping, a renewal); once lost it stays lost."""
        if self._held:
            held = await asyncio.to_thread(self._check)
            self._held = held and not self._stopped
            self._last = time.monotonic()
        return self._held

    def stop(self) -> None:
        """No more checks; the lease released (after a check under way, if any)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._held, self._stopped = False, True
        with self._mutex:
            self.lease.release()

    def _check(self) -> bool:
        with self._mutex:
            return self.lease.alive()

    async def _run(self) -> None:
        while self._held:
            await asyncio.sleep(max(0.0, self._last + self.poll - time.monotonic()))
            if time.monotonic() - self._last >= self.poll:  # not checked meanwhile (still_leading)
                try:
                    await self.alive()
                except RuntimeError:  # the loop's executor shut down: the controller is stopping
                    return
