"""What one reading cannot show: how fast a node's error counters rise, and its recent XID events.

Kept in memory per node (NodeState.trends), fed by apply_frame from the readings it applies; not
stored, so after a controller restart rates start afresh from the next frames. A counter keeps only
the points where its total changed (and the time of its latest reading), so a quiet counter costs
one tuple comparison per reading however long it is watched; counters read together (a GPU's
NVLinks, an IB port's) share their change points. A total that goes down is a reset (driver reload,
agent restart): the window starts over. Unset counters read as 0.

Counter keys name the reading, e.g. "gpu3.nvlink7.crc_errors_total" or
"ib.mlx5_0/1.symbol_error_total" (see gpu_key / nvlink_key / ib_key).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from operator import attrgetter

from controller.fleet.repeated import each
from protos.gpufleet.v1 import telemetry_pb2 as pb

WINDOW_SECONDS = 600.0  # rates and increases are over this much of the newest readings
MAX_XIDS = 256  # XID events kept per node (newest)
XID_KEEP_SECONDS = 3600.0  # ...and for at most this long after the node's newest reading

NVLINK_COUNTERS = ("crc_errors_total", "replay_errors_total", "recovery_errors_total")
IB_COUNTERS = (
    "link_downed_total",
    "symbol_error_total",
    "port_rcv_errors_total",
    "link_error_recovery_total",
)
GPU_COUNTERS = ("ecc_uncorrected_volatile_total", "pcie_replay_errors_total")
_LINK_READ = attrgetter("link", *NVLINK_COUNTERS)  # (link, its counters...), read in C
_IB_READ = attrgetter("device", "port", *IB_COUNTERS)  # (device, port, its counters...), read in C


def link_read(sample: pb.GpuSample) -> tuple[tuple[int, ...], ...]:
    """A GPU's NVLink error counters as observe_links takes them: (link, crc, replay, recovery) each."""
    return tuple(map(_LINK_READ, sample.nvlinks))


def links_seen(sample: pb.GpuSample) -> object:
    """What finds a GPU's NVLink error counters unchanged since a reading: the digest of them its
    agent sends (GpuSample.nvlink_errors_digest), else their link_read (an older agent's)."""
    return sample.nvlink_errors_digest or link_read(sample)


def ports_seen(host: pb.HostSample) -> object:
    """What finds a host's InfiniBand error counters unchanged since a reading: the digest of its
    ports its agent sends (HostSample.infiniband_digest), else their _IB_READ (an older agent's)."""
    return host.infiniband_digest or tuple(map(_IB_READ, host.infiniband))


def gpu_key(gpu: int, counter: str) -> str:
    return f"gpu{gpu}.{counter}"


def nvlink_key(gpu: int, link: int, counter: str) -> str:
    return f"gpu{gpu}.nvlink{link}.{counter}"


def nvlink_group(gpu: int) -> str:
    """The group of a GPU's NVLink counters (every link's, read together)."""
    return f"gpu{gpu}.nvlink"


def ib_key(device: str, port: int, counter: str) -> str:
    return f"ib.{device}/{port}.{counter}"


def ib_group(device: str, port: int) -> str:
    """The group of an InfiniBand port's counters (read together)."""
    return f"ib.{device}/{port}"


@dataclass(slots=True)
class _Group:
    """Counters read together (one GPU's NVLinks, one IB port): one change point per reading that
    changed any of them, so a quiet GPU costs one tuple comparison per frame."""

    # (time first seen, totals), oldest first: a list, not a deque (a group holds one point nearly
    # always, and a deque's first block is ~700 bytes: some 18 KB a node, 26 groups)
    points: list[tuple[float, tuple[float, ...]]]
    last: float  # time of the newest reading
    names: tuple[str, ...]  # the counter keys, in the order of the totals
    # The newest accepted reading as its caller read it (one GPU's links: their digest as the agent
    # sent it, else a tuple per link), so an unchanged reading is found in one comparison without
    # flattening it; None: not kept. A cache: two groups holding the same points are equal whatever
    # they saw.
    seen: object = field(default=None, compare=False)

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled without `seen` (a GPU's 18 link tuples): the next reading is compared by its
        # totals instead (observe_group), which keeps it again.
        return _Group, (self.points, self.last, self.names)


@dataclass(frozen=True, slots=True)
class XidSeen:
    time: float  # when the driver logged it (the event's time; the frame's when it had none)
    gpu: int
    code: int


@dataclass(slots=True)
class Trends:
    window_seconds: float = WINDOW_SECONDS
    groups: dict[str, _Group] = field(default_factory=dict)
    # Counter key -> (group, position): built from the groups' names at the first look-up of a
    # counter (`found`), kept up to date from then; None until then. Only a node whose counters rose
    # is ever looked up (the detectors ask `changed` first), and some 490 entries a node were the
    # largest part of a detection process's copy of the fleet (about 40 KB a node).
    where: dict[str, tuple[str, int]] | None = field(default=None, compare=False)
    xids: deque[XidSeen] = field(default_factory=lambda: deque(maxlen=MAX_XIDS))
    # The host's InfiniBand ports as observe_host last took them (ports_seen: their digest, or _IB_READ
    # of each) and their groups, each holding that reading as its newest; None: not kept (nor
    # pickled). A cache.
    ib_seen: tuple[object, tuple[_Group, ...]] | None = field(default=None, compare=False)

    def __getstate__(self) -> tuple[float, dict[str, _Group], deque[XidSeen]]:
        """Pickled without `where` (a detection process's copy of the fleet: some 490 entries a node,
        a fifth of its trends' bytes), which the groups' names give again when first asked."""
        return self.window_seconds, self.groups, self.xids

    def __setstate__(self, state: tuple[float, dict[str, _Group], deque[XidSeen]]) -> None:
        self.window_seconds, self.groups, self.xids = state
        self.ib_seen = None
        self.where = None

    def found(self, key: str) -> tuple[str, int] | None:
        """The counter's (group, position), None for an unknown counter."""
        where = self.where
        if where is None:
            where = self.where = {
                name: (group, position)
                for group, g in self.groups.items()
                for position, name in enumerate(g.names)
            }
        return where.get(key)

    def observe(self, key: str, time: float, total: float) -> None:
        """One counter's reading (a group of its own)."""
        self.observe_group(key, (key,), time, (total,))

    def observe_group(
        self,
        group: str,
        names: tuple[str, ...],
        time: float,
        totals: tuple[float, ...],
        seen: object = None,
    ) -> None:
        """The group's totals read at `time`, in the order of `names`; `seen` is the reading as its
        caller read it, kept for observe_read's comparison."""
        g = self.groups.get(group)
        if g is None or g.names != names:  # new, or the set of counters changed (a link appeared)
            self.groups[group] = _Group([(time, totals)], time, names, seen)
            where = self.where
            if where is not None:
                for name in g.names if g is not None else ():
                    where.pop(name, None)
                for position, name in enumerate(names):
                    where[name] = (group, position)
            return
        if time < g.last:
            return  # an older reading (a replayed spool): the window already moved past it
        newest = g.points[-1][1]
        if totals != newest:
            if any(t < n for t, n in zip(totals, newest, strict=True)):
                g.points.clear()  # a reset (driver reload, agent restart): count from here
            g.points.append((time, totals))
        g.seen = seen
        self._advance(g, time)

    def observe_links(self, gpu: int, time: float, sample: pb.GpuSample) -> None:
        """A GPU's NVLink counters, read as (link, crc, replay, recovery) per link (link_read): a
        reading equal to the newest (the usual case: error counters stay put, the same links) only
        moves the window; any other is observed as the group's totals. The reading is known equal by
        its digest (GpuSample.nvlink_errors_digest) when the agent sends one, without reading the
        links; else by reading them."""
        group = nvlink_group(gpu)
        g = self.groups.get(group)
        key = links_seen(sample)
        if g is not None and g.seen == key and time >= g.last:
            self._advance(g, time)
            return
        read = key if isinstance(key, tuple) else link_read(sample)
        names = _link_names(gpu, tuple(r[0] for r in read))
        self.observe_group(group, names, time, tuple(chain.from_iterable(r[1:] for r in read)), key)

    def _advance(self, g: _Group, time: float) -> None:
        g.last = time
        start = time - self.window_seconds
        while len(g.points) >= 2 and g.points[1][0] <= start:
            del g.points[0]  # points[0] stays the totals as the window starts

    def changed(self, group: str) -> bool:
        """Whether any counter of the group changed within the window: a quiet group (the usual
        case) has no counter with a rate, and its counters need no look one by one."""
        g = self.groups.get(group)
        return g is not None and len(g.points) >= 2

    def increase(self, key: str) -> float:
        """How much the counter rose over the window (0 for an unknown counter)."""
        found = self.found(key)
        if found is None:
            return 0.0
        g, position = self.groups[found[0]], found[1]
        return g.points[-1][1][position] - g.points[0][1][position]

    def span(self, key: str) -> float:
        """Seconds of readings the window holds for the counter (0 with a single reading)."""
        found = self.found(key)
        if found is None:
            return 0.0
        g = self.groups[found[0]]
        return max(0.0, g.last - max(g.points[0][0], g.last - self.window_seconds))

    def rate(self, key: str) -> float | None:
        """Per second over the window; None until two readings apart in time were seen."""
        span = self.span(key)
        return self.increase(key) / span if span > 0 else None

    def recent_xids(self, since: float) -> list[XidSeen]:
        return [x for x in self.xids if x.time >= since]

    def observe_gpu(
        self, sample: pb.GpuSample, time: float, *, counters: bool = True, links_unchanged: bool = False
    ) -> None:
        """A GPU's error counters (unset ones read as 0; not with counters=False) and its new XID
        events. links_unchanged: its NVLinks read (link_read) as in the GPU's reading observed
        last, as the frame's planner found (controller/fronts/planner.py): not read again."""
        index = sample.index
        if counters:
            self.observe_group(
                f"gpu{index}",
                _gpu_names(index),
                time,
                (float(sample.ecc_uncorrected_volatile_total), float(sample.pcie_replay_errors_total)),
            )
            links = sample.nvlinks
            g = self.groups.get(nvlink_group(index)) if links_unchanged and links else None
            if g is not None and time >= g.last:
                self._advance(g, time)  # as observe_links does with a reading equal to the newest
            elif links:
                self.observe_links(index, time, sample)
        for event in each(sample.xid_events):
            at = event.unix_time_seconds or time
            self.xids.append(XidSeen(at, index, event.code))
        while self.xids and self.xids[0].time < time - XID_KEEP_SECONDS:
            self.xids.popleft()

    def observe_host(self, host: pb.HostSample, time: float) -> None:
        """The host's InfiniBand port counters, a group per port. A reading of the ports equal to the
        one taken last (the usual case: error counters stay put, the same ports) only moves each
        group's window, as observe_group would with totals equal to the newest. It is known equal by
        its digest (HostSample.infiniband_digest) when the agent sends one, without reading the
        ports; else by reading them."""
        key = ports_seen(host)
        seen = self.ib_seen
        if seen is not None and seen[0] == key and all(time >= g.last for g in seen[1]):
            for g in seen[1]:
                self._advance(g, time)
            return
        groups = []
        read = key if isinstance(key, tuple) else tuple(map(_IB_READ, host.infiniband))
        for device, port, *counters in read:
            name = ib_group(device, port)
            self.observe_group(name, _ib_names(device, port), time, tuple(map(float, counters)))
            groups.append(self.groups[name])
        # Kept only when every port's reading was taken as its group's newest, once: not a reading
        # older than a group's (ignored there), nor a port listed twice (its last reading counts).
        taken = all(g.last == time for g in groups) and len(set(map(id, groups))) == len(groups)
        self.ib_seen = (key, tuple(groups)) if taken else None


@lru_cache(maxsize=4096)
def _gpu_names(gpu: int) -> tuple[str, ...]:
    return tuple(gpu_key(gpu, name) for name in GPU_COUNTERS)


@lru_cache(maxsize=4096)
def _link_names(gpu: int, links: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(nvlink_key(gpu, link, name) for link in links for name in NVLINK_COUNTERS)


@lru_cache(maxsize=4096)
def _ib_names(device: str, port: int) -> tuple[str, ...]:
    return tuple(ib_key(device, port, name) for name in IB_COUNTERS)
