"""The controller's open-file limit, raised at start to what a fleet of limits.max_nodes needs.

Every agent holds a connection, a file descriptor in the controller (or in the ingest front that
serves it). While a node reconnects, its old connection is often still open: the old socket is
closed once gRPC has let go of its stream, or, after a network blip, once the keepalive finds it dead.
So a fleet reconnecting at once (a restart, a failover, a blip) holds up to two a node for a while.

Past the limit, gRPC's listener cannot accept: it logs "File descriptor limit reached. Retrying."
and tries again a second later, while the agents' connections wait in the kernel's backlog or time out
in their handshake and back off. Seen with bench/controller_scale.py at 16,000 nodes on a host whose
limit was 20,000 (hard and soft): the listeners logged it 16 times from 13 to 30 s after the drop, no
node was taken back until 28 s after it, 460 connection attempts failed, and the fleet was back at
p99 87.9 s from the drop (bench/results/2026-12-02_open_files.txt; how much of that the limit caused
was not separated, as that host's hard limit could not be raised). Under a soft limit of 1,024 a
controller would take no agent past about a thousand (under 64, it took in 29 of 200 connections:
tests/controller/test_open_files.py, the limit left as it was).

Hosts often start a process with a soft limit of 1,024 (systemd's default, which some container
runtimes pass on to their containers) under a far higher hard one (systemd's: 524,288). The soft
limit is the process's to raise up to the hard one, so the controller does (as Go's runtime does for
every Go program), before it starts its children (the detection process, the ingest fronts), which
inherit it. When even the hard limit is below what the fleet needs, it says so and goes on: it
serves fewer nodes than it could, not none.
"""

from __future__ import annotations

import logging
import math
import os
import resource
from dataclasses import dataclass

FILES_A_NODE = 2  # its connection, and its old one while it reconnects
OTHER_FILES = 1024  # the store, pipes to the children, listeners, operators' connections, logs

log = logging.getLogger("gpufleet.controller.open_files")


@dataclass(frozen=True, slots=True)
class OpenFiles:
    before: int  # the soft limit the process started with (resource.RLIM_INFINITY: none)
    limit: int  # the soft limit now
    hard: int
    needed: int  # what limits.max_nodes may take at once (needed_files)


def needed_files(max_nodes: int) -> int:
    return FILES_A_NODE * max_nodes + OTHER_FILES


def raise_open_files(max_nodes: int) -> OpenFiles:
    """Raise the soft RLIMIT_NOFILE to the hard limit (to what the fleet needs, when the hard limit is
    unlimited); log what changed, and a warning when the limit stays below needed_files(max_nodes)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = needed_files(max_nodes)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    limit = soft
    if soft != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:  # e.g. above the kernel's fs.nr_open
            log.warning("open files: could not raise the soft limit from %d to %d: %s", soft, target, exc)
        else:
            limit = target
            log.info("open files: soft limit raised from %d to %d", soft, target)
    if limit != resource.RLIM_INFINITY and limit < needed:
        log.warning(
            "open files: the limit is %d, below the %d that limits.max_nodes %d may hold at once (each "
            "node's connection, and its old one while it reconnects): a fleet that large reconnecting "
            "at once would stall until connections close. Raise the hard limit (ulimit -Hn, systemd's "
            "LimitNOFILE=, the container runtime's nofile) or lower limits.max_nodes",
            limit,
            needed,
            max_nodes,
        )
    return OpenFiles(before=soft, limit=limit, hard=hard, needed=needed)


def open_files(pid: int | None = None) -> int | None:
    """How many files process `pid` (None: this one) has open, from /proc (a listing: about 16 ms
    at 16,000 open); None where that cannot be read (not Linux, the process gone)."""
    try:
        listed = os.listdir(f"/proc/{'self' if pid is None else pid}/fd")
    except OSError:
        return None
    return len(listed) - (1 if pid is None else 0)  # this process's listing held one open itself


def soft_limit() -> float:
    """This process's soft open-file limit (inf: none)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return math.inf if soft == resource.RLIM_INFINITY else float(soft)
