"""Two controllers with replica_ingest in one process on one store, for tests: the leader, started,
and a standby waiting for the lead while it serves its agents (replica_ingest, controller/replicas.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from controller.app import ControllerApp
from controller.replicas import ReplicaFeed
from tests.controller.harness import Clock, config

SYNC_SECONDS = 5.0


@dataclass
class Replicas:
    leader: ControllerApp
    standby: ControllerApp
    waiting: asyncio.Task[None]  # the standby's start(): done once it leads

    @property
    def feed(self) -> ReplicaFeed:
        """The leader's side of replica_ingest."""
        assert isinstance(self.leader.replicas, ReplicaFeed)
        return self.leader.replicas

    @property
    def standby_feed(self) -> ReplicaFeed:
        assert isinstance(self.standby.replicas, ReplicaFeed)
        return self.standby.replicas


@contextlib.asynccontextmanager
async def leader_and_standby(
    db: str, clock: Clock, *, detection: bool = False, warm_standby: bool = True
) -> AsyncIterator[Replicas]:
    """With `detection`, the leader's detectors run in their process (start_detection_process)."""
    cfg = config(db=db, replica_ingest=True, replica_sync_seconds=SYNC_SECONDS, warm_standby=warm_standby)
    leader, standby = ControllerApp(cfg, clock=clock), ControllerApp(cfg, clock=clock)
    standby.holder = standby.store.owner = "standby:2"  # one process: give them two names
    await leader.start()
    serving = asyncio.Event()

    async def ingest_here() -> None:
        serving.set()
        await asyncio.Event().wait()

    waiting = asyncio.create_task(standby.start(standby_work=ingest_here))
    try:
        if detection:
            await leader.start_detection_process()
        await asyncio.wait_for(serving.wait(), 10)
        yield Replicas(leader, standby, waiting)
    finally:
        waiting.cancel()
        if leader.detection is not None:
            await leader.detection.stop()
        leader.close()
        standby.close()
