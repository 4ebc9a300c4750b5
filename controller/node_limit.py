"""limits.max_nodes: how many nodes the controller holds at most.

A Hello from a node the controller does not know is refused (RESOURCE_EXHAUSTED) while it knows
max_nodes nodes already; a known node always comes back. Hellos being registered count too, so a
burst of new nodes cannot overshoot. Refusals are counted, and logged at most once a minute.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping

from controller.errors import ResourceExhausted

log = logging.getLogger("gpufleet.controller.limits")
LOG_EVERY_SECONDS = 60.0


class NodeLimit:
    def __init__(self, max_nodes: int | None, clock: Callable[[], float] = time.time) -> None:
        self.max_nodes = max_nodes  # None: no limit
        self.clock = clock
        self.refused = 0  # Hellos refused since start
        self._joining: set[str] = set()  # new nodes whose Hello is being registered
        self._logged_at = -math.inf
        self._unlogged = 0

    @contextlib.asynccontextmanager
    async def joining(self, known: Mapping[str, object], node: str) -> AsyncIterator[None]:
        """Hold a place for `node` while its Hello is registered; raises ResourceExhausted when it is
        new and the controller is full."""
        if node in known or node in self._joining:
            yield
            return
        if self.max_nodes is not None and len(known) + len(self._joining) >= self.max_nodes:
            self._refuse(node)
            raise ResourceExhausted(
                f"this controller holds its limit of {self.max_nodes} nodes (limits.max_nodes): node refused"
            )
        self._joining.add(node)
        try:
            yield
        finally:
            self._joining.discard(node)

    def _refuse(self, node: str) -> None:
        self.refused += 1
        self._unlogged += 1
        now = self.clock()
        if now - self._logged_at >= LOG_EVERY_SECONDS:
            log.warning(
                "refused %d Hello(s) from new nodes (latest %r): limits.max_nodes=%d reached",
                self._unlogged,
                node,
                self.max_nodes,
            )
            self._logged_at, self._unlogged = now, 0
