"""How a detection process gets its copy of the fleet: in slices of NODES_PER_SLICE nodes, each one
encoded from the controller's fleet as it is at that moment and written once the processes have
read most of what waits in their pipes. Encoding a node costs about 1.7 ms and 80 KB (its readings,
counter trends and probe results), so a 12,500-node fleet in one message stalled the event loop
for about 20 s and queued about 1 GB at once, past the process's hung-pipe limit
(process.MAX_BUFFERED_BYTES): the process was stopped before it had read its copy, every pass.

The changes the controller applies meanwhile go to the processes as usual, between slices, in
order. A change to a node already sent is applied there; one to a node not sent yet is skipped
there (a frame, a connection), or builds the node anew (a Hello, an adopted row), and the node's
slice, encoded later from the fleet that change went into, then replaces it. A node the controller
forgets before its slice is not sent; one new since the copy began comes with its Hello.

Agents first: while the controller is taking agents in (`busy`: Hellos under way, as when a replica
dies and its agents move to the one taking the lead, or a restarted controller's fleet reconnects),
the next slice waits, up to YIELD_SECONDS over the whole copy. Encoding the copy took a third of the
heir's event loop while thousands of Hellos waited on it; detection starts that much later."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from controller.config import DetectConfig
from controller.detection.wire import encode
from controller.fleet.expiry import forget
from controller.fleet.model import Fleet

if TYPE_CHECKING:
    from controller.detection.process import DetectionProcess

log = logging.getLogger("gpufleet.controller.detect")
NODES_PER_SLICE = 50  # about 0.08 s of encoding per slice (1.2-1.7 ms a node)
LOW_WATER_BYTES = 16 * 1024 * 1024  # the next slice waits until every pipe holds less than this
INDEX_BATCH = 50_000  # keys grouped between two turns of the event loop
STALL_SECONDS = 120.0  # a process that reads nothing of its copy this long is taken as hung
YIELD_SECONDS = 60.0  # the most a copy waits, in all, for the agents being taken in
YIELD_POLL_SECONDS = 0.05


def shell(fleet: Fleet) -> Fleet:
    """The fleet without its nodes and their entries (sent in slices), nor derived caches."""
    return Fleet(implausible=dict(fleet.implausible))


class NodeEntries:
    """Each node's keys in the fleet's probe results, probe history and ack positions (their first
    member is the node), so that a slice takes its nodes' entries without a look at every key.

    Built once (`prepare`, in batches between which the loop runs), then kept up: the keys added
    since are the newest in the dicts' order, found from the end (a value replaced keeps its key's
    place; keys go only when nodes are forgotten, which bumps fleet.forgets, and then it is built
    again). The values are read when a slice is made, so each is the fleet's at that moment."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._forgets = -1  # fleet.forgets when built; -1: not built
        self._sizes: tuple[int, ...] = (0, 0, 0)
        self._keys: tuple[dict[str, list[Any]], ...] = ({}, {}, {})
        self.builds = 0

    def _tables(self) -> tuple[dict[Any, Any], ...]:
        return (self.fleet.probes, self.fleet.history, self.fleet.acked)

    async def prepare(self) -> None:
        """Build the index, letting the event loop run every INDEX_BATCH keys."""
        while self._forgets != self.fleet.forgets:
            forgets = self.fleet.forgets
            snapshot = [list(table) for table in self._tables()]  # in C: the loop may change them after
            keys: tuple[dict[str, list[Any]], ...] = ({}, {}, {})
            for grouped, listed in zip(keys, snapshot, strict=True):
                for start in range(0, len(listed), INDEX_BATCH):
                    _group(listed[start : start + INDEX_BATCH], grouped)
                    await asyncio.sleep(0)
            self._keys, self._sizes, self._forgets = keys, tuple(map(len, snapshot)), forgets
            self.builds += 1

    def _catch_up(self) -> None:
        tables = self._tables()
        sizes = tuple(map(len, tables))
        if self._forgets != self.fleet.forgets or any(
            now < then for now, then in zip(sizes, self._sizes, strict=True)
        ):
            self._build_now()  # nodes were forgotten: rare, and built at once
            return
        for grouped, table, now, then in zip(self._keys, tables, sizes, self._sizes, strict=True):
            if now > then:
                _group(reversed(list(islice(reversed(table), now - then))), grouped)
        self._sizes = sizes

    def _build_now(self) -> None:
        tables = self._tables()
        self._keys = tuple(_group(table, {}) for table in tables)
        self._sizes = tuple(map(len, tables))
        self._forgets = self.fleet.forgets
        self.builds += 1

    def slice_message(self, names: Iterable[str]) -> tuple[Any, ...]:
        """("nodes", nodes, probe results, probe history, ack positions) of the named nodes the
        fleet holds now."""
        fleet = self.fleet
        nodes = {name: fleet.nodes[name] for name in names if name in fleet.nodes}
        self._catch_up()
        parts = [
            {key: table[key] for name in nodes for key in of_node.get(name, ())}
            for table, of_node in zip(self._tables(), self._keys, strict=True)
        ]
        return ("nodes", nodes, *parts)


def _group(keys: Iterable[tuple[Any, ...]], grouped: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """`keys` added to `grouped`, by node (their first member)."""
    for key in keys:
        found = grouped.get(key[0])
        if found is None:
            grouped[key[0]] = [key]
        else:
            found.append(key)
    return grouped


def slice_message(fleet: Fleet, names: Iterable[str]) -> tuple[Any, ...]:
    """One slice's message, from a fresh look at the fleet's keys (send_fleet keeps its NodeEntries)."""
    return NodeEntries(fleet).slice_message(names)


def install(fleet: Fleet, message: tuple[Any, ...]) -> None:
    """A slice into the process's fleet: each node as sent replaces what the process built of it."""
    _, nodes, probes, history, acked = message
    known = [name for name in nodes if name in fleet.nodes]
    if known:
        forget(fleet, known)
    fleet.nodes.update(nodes)
    fleet.members += 1
    fleet.probes.update(probes)
    fleet.history.update(history)
    fleet.acked.update(acked)
    fleet.probe_version += 1  # what detectors derived from probe results is stale


async def send_fleet(
    processes: Sequence[DetectionProcess],
    fleet: Fleet,
    config: DetectConfig,
    names: list[str],
    busy: Callable[[], bool] | None = None,
) -> None:
    """Give each of `processes` (just started) a copy of `fleet`, each message encoded once for all.
    A process that reads nothing for STALL_SECONDS is stopped (its next pass fails, and the one
    after starts it anew); the others get the rest. While `busy()` (agents being taken in), the
    next slice waits, up to YIELD_SECONDS in all."""
    data = encode(("init", shell(fleet), config, names))
    for process in processes:
        process.send(data)
    order, entries = list(fleet.nodes), NodeEntries(fleet)
    await entries.prepare()
    yielded = 0.0
    for start in range(0, len(order), NODES_PER_SLICE):
        if busy is not None and yielded < YIELD_SECONDS:
            yielded += await _yield(busy, YIELD_SECONDS - yielded)
        await _drained(processes)
        data = encode(entries.slice_message(order[start : start + NODES_PER_SLICE]))
        for process in processes:
            process.send(data)
    for process in processes:
        process.flush()  # the copy's end now, not after the changes' delay


async def _yield(busy: Callable[[], bool], most: float) -> float:
    """Wait while busy(), for at most `most` seconds; how long it waited."""
    began = time.monotonic()
    waited = 0.0
    while busy() and waited < most:
        await asyncio.sleep(YIELD_POLL_SECONDS)
        waited = time.monotonic() - began
    return waited


async def _drained(processes: Sequence[DetectionProcess]) -> None:
    """Until every running process's pipe holds less than LOW_WATER_BYTES; the loop runs at least
    once, whatever the pipes hold, so that each slice's encoding is a stall of its own."""
    await asyncio.sleep(0)
    progress = {id(process): (process.waiting_bytes(), time.monotonic()) for process in processes}
    while True:
        behind = [p for p in processes if p.running and p.waiting_bytes() >= LOW_WATER_BYTES]
        if not behind:
            return
        await asyncio.sleep(0.01)
        now = time.monotonic()
        for process in behind:
            waiting = process.waiting_bytes()
            last, since = progress[id(process)]
            if waiting < last:
                progress[id(process)] = (waiting, now)
            elif now - since > STALL_SECONDS:
                log.error(
                    "the detection process read nothing of its copy for %.0f s: stopping it", STALL_SECONDS
                )
                await process.stop()
