"""Several gRPC servers on the agents' port, so that a fleet reconnecting at once is taken in parallel.

gRPC's asyncio server takes new calls one at a time: it asks its core for the next call and asks for
another only once that one has reached the event loop (`_server_main_loop` in grpc's
`_cython/_cygrpc/aio/server.pyx.pxi`). Each new stream so waits for a whole turn of a loop that is
busy with the frames of the nodes already back. When the fleet reconnects at once (a controller
restart, a failover, a network blip), the server takes in one stream per turn.

With `listeners` servers bound to one address (SO_REUSEPORT), the kernel spreads the agents'
connections over them, and each server has its own call requested. Each server serves everything the
port serves, the operators' API included. gRPC already sets SO_REUSEPORT on its listening sockets on
Linux by default (grpc/grpc#10755), so this lets no other process share the port that could not
before.

Measured with `bench/controller_scale.py --steps 2000 --reconnect-storm --transport-floor` on 2 cores,
against a bare server that only acks: with one server the fleet was back at p99 6.0-6.3 s after the
drop, with 8 servers at 4.2-4.4 s. The generator then used the cores the server no longer waited on.
"""

from __future__ import annotations

import asyncio
import errno
import math
import socket
from collections.abc import Callable

import grpc

REUSEPORT = ("grpc.so_reuseport", 1)
# gRPC core answers data it receives with a bandwidth-delay probe (a PING, and its answer read back)
# to size the flow-control window. An agent's stream carries one ~15 KB frame every 10 s, so nearly
# every frame drew its own probe: a fifth of the transport's CPU per frame (bench/controller_scale.py
# --transport-floor: 1.04 -> 0.81 ms). Without it each stream's window stays at HTTP/2's 64 KB, which
# also bounds what a server buffers per stream (12,500 streams: 800 MB at most).
NO_BDP_PROBE = ("grpc.http2.bdp_probe", 0)
# Beyond the agents, what the port may have waiting at once (operators' calls): gRPC's own default.
OTHER_CALLS = 1000


def call_backlog(max_nodes: int) -> list[tuple[str, int]]:
    """How many new calls gRPC core holds for a server before its event loop takes them (every node
    the controller may hold, and OTHER_CALLS more), and for how long (call_wait, queue_seconds).

    Core queues a call that arrives before the server asked for one (and the asyncio server asks for
    one a turn of its loop, above). Past `grpc.server.max_pending_requests` (default 1,000) it drops
    new calls at random, all of them past the hard limit (default 3,000): the agent reads CANCELLED,
    or INTERNAL "Internal error from Core" when its Hello was still being sent, and tries again after
    its backoff. A fleet reconnecting at once queues about a node a call, so the storm lost nodes to
    it: 10-323 of 4,000 with 2 ingest fronts (2,000 each), 234-461 of 12,500 with 8 listeners, none
    once the backlog holds the fleet (bench/results/2026-12-02_call_backlog.txt)."""
    backlog = max_nodes + OTHER_CALLS
    return [
        ("grpc.server.max_pending_requests", backlog),
        ("grpc.server.max_pending_requests_hard_limit", backlog),
        *call_wait(queue_seconds(max_nodes)),
    ]


# How long a new call may wait in that queue, a node's share: a storm of the whole fleet taken in at
# this much of the loop a node is taken in before any call waits too long. The loop took 1.1-1.7 ms
# a node in storms on 2 cores (bench/results/2026-12-02_storm_by_size_and_what_is_left.txt), and the
# answer to a Hello came at p99 22-25 s in a 12,500-node storm: gRPC's 30 s was near.
QUEUE_SECONDS_A_NODE = 0.005
MIN_QUEUE_SECONDS = 30  # gRPC's default: no fleet waits less than it did


def queue_seconds(max_nodes: int) -> int:
    """How long a new call waits in core's queue for the server, at most: 100 s at 20,000 nodes.
    Past it core cancels the call (the agent reads CANCELLED, backs off and tries again, at the back
    of the queue), so too short a wait keeps a large storm from settling; too long one keeps an
    agent waiting on a server whose loop is stuck (the keepalive pings are answered by core)."""
    return max(MIN_QUEUE_SECONDS, math.ceil(max_nodes * QUEUE_SECONDS_A_NODE))


def call_wait(seconds: int) -> list[tuple[str, int]]:
    """The server option that cancels a call left unrequested `seconds`."""
    return [("grpc.server_max_unrequested_time_in_server", seconds)]


class Listeners:
    """The servers bound to one address, stopped together."""

    def __init__(self, servers: list[grpc.aio.Server]) -> None:
        self.servers = servers

    async def stop(self, grace: float | None) -> None:
        await asyncio.gather(*(server.stop(grace) for server in self.servers))


def shares_port(address: str) -> bool:
    """Whether servers can share `address` through SO_REUSEPORT (a TCP host:port; not a Unix socket,
    whose path a second server would take from the first)."""
    return not address.startswith("unix")


def refuse_if_taken(address: str) -> None:
    """OSError (`cannot listen on ADDRESS: already in use ...`) when another server listens there."""
    taken = taken_by_another(address)
    if taken:
        raise OSError(f"cannot listen on {address}: {taken}")


def taken_by_another(address: str) -> str:
    """Why `address` (HOST:PORT, port not 0) is already being listened on, by another process or
    server ('' if it is free). gRPC sets SO_REUSEPORT on its listening sockets, so a second
    controller (an old one left running, a second copy started by hand) bound the same port without
    an error, and the kernel then spread the agents' connections over two controllers and two
    stores. A socket of our own without SO_REUSEPORT cannot bind a port another socket listens on
    (SO_REUSEADDR: a restarted controller's connections in TIME_WAIT do not count)."""
    host, _, port = address.rpartition(":")
    if not shares_port(address) or port in ("", "0"):
        return ""
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return ""  # gRPC's own bind says what is wrong with it
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return "already in use (another gpufleet controller, or another program)"
    return ""


async def listen_on(
    address: str,
    count: int,
    build: Callable[[], grpc.aio.Server],
    bind: Callable[[grpc.aio.Server, str], int],
) -> tuple[Listeners, str]:
    """`count` servers from `build`, the first bound by `bind` to `address` (port 0: one the OS
    chooses), the others to the port it got; all started. OSError when a bind fails, with none of them
    left listening."""
    host = address.rpartition(":")[0]
    refuse_if_taken(address)
    started: list[grpc.aio.Server] = []
    try:
        port = 0
        for _ in range(count if shares_port(address) else 1):
            server = build()
            got = _bound(server, bind, address if not started else f"{host}:{port}")
            port = port or got
            await server.start()
            started.append(server)
    except BaseException:
        await Listeners(started).stop(None)
        raise
    return Listeners(started), f"{host}:{port}"


def _bound(server: grpc.aio.Server, bind: Callable[[grpc.aio.Server, str], int], address: str) -> int:
    try:
        port = bind(server, address)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address}: {exc}") from exc
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return port
