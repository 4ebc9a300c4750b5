"""Where a controller stands, told to Kubernetes: its health endpoint and its pod's role label.

`health_listen` (the chart sets it) serves, over plain HTTP, from before the controller waits for
the lead:
- /livez: 200 while the event loop answers;
- /readyz: 200 with the role (`standby` while another leads, `leader` once this one leads and
  listens), 503 with the reason before that, or while the pod's role label (controller/kube/role.py)
  does not say that role yet.
A standby is Ready; the Service keeps agents off it by the role label, not by readiness.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from controller.kube.cluster import Cluster
from controller.kube.role import LEADER, STANDBY, PodRole
from protos import scrape_http

log = logging.getLogger("gpufleet.controller")
TEXT = "text/plain; charset=utf-8"


class Standing:
    def __init__(self, cluster: Cluster, environ: Mapping[str, str]) -> None:
        self.phase = "starting"  # then standby (waiting for the lead) or leader (leading, listening)
        self.role = PodRole.from_env(cluster, environ)
        self._stop = asyncio.Event()
        self._keeping: asyncio.Task[None] | None = None
        self._server: scrape_http.ScrapeServer | None = None

    async def begin(self, health_listen: str | None) -> str | None:
        """Serve health (when asked; the address bound) and start labelling the pod `standby`.
        OSError when the health address cannot be bound."""
        bound = None
        if health_listen is not None:
            try:
                sock = scrape_http.listen(health_listen)
            except ValueError as exc:
                raise OSError(f"cannot serve health on {health_listen}: {exc}") from None
            index = scrape_http.Reply(200, TEXT, b"gpufleet controller: /livez, /readyz\n")
            routes = {"/livez": self._live, "/readyz": self._readiness}
            self._server = scrape_http.ScrapeServer(sock, None, index=index, routes=routes)
            self._server.start()
            bound = scrape_http.bound_address(sock)
            log.info("health on http://%s (/livez, /readyz)", bound)
        if self.role is not None:
            self.role.set(STANDBY)
            self._keeping = asyncio.create_task(self.role.keep(self._stop))
        return bound

    def standby(self) -> None:
        self.phase = STANDBY

    def leading(self) -> None:
        """Leading and listening: the pod takes the leader label."""
        self.phase = LEADER
        if self.role is not None:
            self.role.set(LEADER)

    def readiness(self) -> tuple[bool, str]:
        if self.phase == "starting":
            return False, "starting: opening the store"
        if self.role is not None and not self.role.ready:
            want = self.role.want
            return False, self.role.error or f"{self.phase}: labelling the pod {want}"
        return True, self.phase

    async def end(self) -> None:
        self._stop.set()
        if self._keeping is not None:
            await self._keeping
        if self._server is not None:
            await self._server.stop()

    def _live(self) -> scrape_http.Reply:
        return scrape_http.Reply(200, TEXT, b"ok\n")

    def _readiness(self) -> scrape_http.Reply:
        ready, text = self.readiness()
        return scrape_http.Reply(200 if ready else 503, TEXT, f"{text}\n".encode())
