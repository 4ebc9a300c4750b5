"""One load-generator process: an asyncio loop holding one real gRPC stream per simulated node.

Each node speaks the stream as agent/stream/client.py does: a Hello first, frames only once the
controller accepted it (its initial metadata), then a frame every `interval` seconds at the node's
own phase, whether or not the previous one was acked yet (the agent's spool does the same); acks
come back on the same stream. By default every node has its own channel, hence its own TCP
connection and keepalive, as separate machines would.

The parent steers the worker through a multiprocessing pipe; each request gets one answer:
("grow", n) starts the worker's share of nodes 0..n-1 (connecting over `ramp_seconds`); ("status",)
counts them; ("window",) hands over the measurements since the previous ("window",) and starts
afresh; ("storm",) drops every stream and reconnects all nodes at once, each sending a frame at
once; ("failover", target) counts each node's next stream as a storm's (its streams end as the
controller they reach dies or lets them go: a failover), reconnecting to `target` from then on when
one is given, and a stream that stays open (its replica leads on it) by its next frame acked;
("storm_status",) reports how far either got; ("stop",) ends the worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import random
import re
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import grpc

from agent.stream.backoff import Backoff
from agent.stream.client import CHANNEL_OPTIONS
from controller_scale_load.templates import (
    SIM_CPUS,
    Archetype,
    build_archetype,
    frame_message,
    hello_message,
)
from protos.gpufleet.v1 import telemetry_pb2 as pb

METHOD = "/gpufleet.v1.Telemetry/Stream"
HELLO_TIMEOUT_S = 60.0  # how long a Hello may wait for the controller's answer before it counts as failed
# A channel of its own per node: without a local subchannel pool, gRPC would share one connection.
NODE_CHANNEL_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]


@dataclass(frozen=True)
class WorkerSpec:
    index: int  # this worker takes the nodes whose number % workers == index
    workers: int
    target: str  # the controller's HOST:PORT
    interval: float  # seconds between a node's frames
    seed: int
    run: str  # a tag that makes this run's boot ids unique
    archetypes: int  # simulated nodes whose frames the others borrow
    ramp_seconds: float  # new nodes connect spread over this long
    shared_channel: bool  # one channel (one connection) for the worker's nodes instead of one each
    cpus: int = SIM_CPUS  # logical CPUs each simulated host has (templates.build_archetype)
    per_cpu: bool = False  # frames with each CPU's reading, as older agents sent them
    per_link: bool = False  # frames with each NVLink's traffic and peer, as older agents sent them


@dataclass
class Window:
    """What happened since the window opened."""

    began: float = field(default_factory=time.perf_counter)
    latencies: list[float] = field(default_factory=list)  # ack latency of each acked frame, seconds
    lags: list[float] = field(default_factory=list)  # how late each frame went out against its schedule
    connects: list[float] = field(default_factory=list)  # Hello -> accepted, seconds
    sent: int = 0
    acked: int = 0
    errors: int = 0  # sessions that ended in an error
    commands: int = 0  # commands the controller sent (none expected: the Hellos offer no probes)


@dataclass
class Storm:
    """Every stream dropped at `began` and reopened at once; or, for a failover, ended by the
    controllers from `began` on and reopened as the agent does (its backoff)."""

    began: float
    reconnect: list[float] = field(default_factory=list)  # storm start -> Hello accepted
    answer: list[float] = field(default_factory=list)  # the accepted attempt: Hello sent -> accepted
    first_ack: list[float] = field(default_factory=list)  # the first frame's send -> its ack
    since_storm: list[float] = field(default_factory=list)  # storm start -> the first frame's ack
    # The same, of the nodes that came back on a new stream (every node in a storm; in a failover
    # the leader's): when they were served again.
    moved: list[float] = field(default_factory=list)
    # A failover's streams kept through it (the standby's own): the first frame after it, its send ->
    # its ack. Timed from the kill it would count the wait for the node's next slot (up to --interval).
    kept: list[float] = field(default_factory=list)
    failed: collections.Counter[str] = field(default_factory=collections.Counter)  # attempts, by error
    dropped: float | None = None  # storm start -> every old stream cancelled (this worker's)


@dataclass
class Node:
    number: int
    name: str
    boot: str
    archetype: Archetype
    phase: float  # seconds into each interval at which the node sends
    seq: int = 0  # the last seq sent
    acked: int = 0  # the highest seq acked
    slot: int = -1  # the last schedule slot sent
    sent: collections.deque[tuple[int, float]] = field(default_factory=collections.deque)
    connected: bool = False
    task: asyncio.Task[None] | None = None
    storm_seq: int = 0  # in a storm: the seq of the first frame after reconnecting (0: none pending)
    storm_sent: float = 0.0
    back: bool = False  # counted back since the last storm or failover (once each)
    # A failover began and no frame of the node was acked since: its streams count as a storm's (the
    # standby it reached may accept it and then let it go as it takes the lead, before the ack).
    failing_over: bool = False
    accepted: float = 0.0  # when the controller accepted the node's current stream (perf_counter)


class Worker:
    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.spec = spec
        self.conn = conn
        self.rng = random.Random(f"{spec.seed}:{spec.index}")
        self.backoff = Backoff(rng=self.rng)  # as the agent reconnects (agent/stream/backoff.py)
        self.archetypes: list[Archetype] = []
        self.nodes: list[Node] = []
        self.window = Window()
        self.storm: Storm | None = None
        self.epoch = time.time()  # the schedule's origin: node slots are epoch + phase + k * interval
        self.channel: grpc.aio.Channel | None = None
        self.target = spec.target  # where nodes connect; a failover may move it
        self.stopped = asyncio.Event()
        self.errors_total = 0
        self.last_error = ""
        self.error_kinds: collections.Counter[str] = collections.Counter()  # _kind(exc) -> count

    async def main(self) -> None:
        start = time.time() - 2 * self.spec.interval
        spec = self.spec
        self.archetypes = [
            build_archetype(
                k, spec.seed, start, spec.interval, spec.cpus, per_cpu=spec.per_cpu, per_link=spec.per_link
            )
            for k in range(spec.archetypes)
        ]
        if self.spec.shared_channel:
            self.channel = grpc.aio.insecure_channel(self.spec.target, options=CHANNEL_OPTIONS)
        loop = asyncio.get_running_loop()
        loop.add_reader(self.conn.fileno(), self._on_control)
        self.conn.send(("ready", self.spec.index))
        try:
            await self.stopped.wait()
        finally:
            loop.remove_reader(self.conn.fileno())
            await self._cancel_all()
            if self.channel is not None:
                await self.channel.close(None)

    # -- control ----------------------------------------------------------------------------

    def _on_control(self) -> None:
        try:
            request = self.conn.recv()
        except (EOFError, OSError):  # the parent is gone
            self.stopped.set()
            return
        op = request[0]
        if op == "grow":
            self._grow(int(request[1]))
            self.conn.send(self._status())
        elif op == "status":
            self.conn.send(self._status())
        elif op == "window":
            self.conn.send(self._take_window())
        elif op == "storm":
            self.storm = Storm(time.perf_counter())
            asyncio.get_running_loop().create_task(self._storm())
            self.conn.send({"storm": True})
        elif op == "failover":
            self._failover(request[1])
            self.conn.send({"failover": True})
        elif op == "storm_status":
            self.conn.send(self._storm_status())
        elif op == "stop":
            self.stopped.set()
            self.conn.send({"stopped": True})

    def _status(self) -> dict[str, Any]:
        return {
            "nodes": len(self.nodes),
            "connected": sum(1 for n in self.nodes if n.connected),
            "errors": self.errors_total,
            "last_error": self.last_error,
            "error_kinds": dict(self.error_kinds),
        }

    def _take_window(self) -> dict[str, Any]:
        window, self.window = self.window, Window()
        return {
            **self._status(),
            "seconds": time.perf_counter() - window.began,
            "latencies": window.latencies,
            "lags": window.lags,
            "connects": window.connects,
            "sent": window.sent,
            "acked": window.acked,
            "window_errors": window.errors,
            "commands": window.commands,
            "outstanding": sum(len(n.sent) for n in self.nodes),
        }

    def _storm_status(self) -> dict[str, Any]:
        storm = self.storm
        assert storm is not None, "no storm started"
        return {
            "nodes": len(self.nodes),
            "done": len(storm.since_storm),
            "reconnect": storm.reconnect,
            "answer": storm.answer,
            "first_ack": storm.first_ack,
            "since_storm": storm.since_storm,
            "moved": storm.moved,
            "kept": storm.kept,
            "failed": dict(storm.failed),
            "dropped": storm.dropped,
        }

    # -- nodes ------------------------------------------------------------------------------

    def _grow(self, total: int) -> None:
        """Start this worker's share of nodes 0..total-1 not yet running."""
        first = self.nodes[-1].number + self.spec.workers if self.nodes else self.spec.index
        for number in range(first, total, self.spec.workers):
            node = Node(
                number=number,
                name=f"scale-{number:05d}",
                boot=f"{self.spec.run}-{number:05d}",
                archetype=self.archetypes[number % len(self.archetypes)],
                phase=self.rng.uniform(0.0, self.spec.interval),
            )
            self.nodes.append(node)
            delay = self.rng.uniform(0.0, self.spec.ramp_seconds)
            node.task = asyncio.get_running_loop().create_task(self._run_node(node, delay, storm=False))

    async def _cancel_all(self) -> None:
        tasks = [n.task for n in self.nodes if n.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _storm(self) -> None:
        """Drop every stream, then reconnect every node at once."""
        await self._cancel_all()
        if self.storm is not None:
            self.storm.dropped = time.perf_counter() - self.storm.began
        for node in self.nodes:
            node.back = False
            node.task = asyncio.get_running_loop().create_task(self._run_node(node, 0.0, storm=True))

    def _failover(self, target: str | None) -> None:
        """From now, each node's next accepted stream is a storm's reconnection (to `target` if given)."""
        if target is not None and self.channel is not None:
            raise ValueError("a failover moves each node's own channel: not with a shared channel")
        self.storm = Storm(time.perf_counter())
        self.target = target or self.target
        for node in self.nodes:
            node.failing_over, node.back = True, False

    async def _run_node(self, node: Node, delay: float, *, storm: bool) -> None:
        """The node's sessions, one after another; between them the agent's own backoff (0.5 s
        doubling to 30 s, jittered, from the first again once a session was accepted): a fixed
        retry of about a second had the whole fleet hammer a controller that could not keep up."""
        await asyncio.sleep(delay)
        attempt = 0
        while not self.stopped.is_set():
            counted = storm or node.failing_over
            try:
                await self._session(node, counted)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError) as exc:
                self.window.errors += 1
                self.errors_total += 1
                self.last_error = f"{node.name}: {_describe(exc)}"
                self.error_kinds[_kind(exc)] += 1
                if counted and self.storm is not None:
                    self.storm.failed[_kind(exc)] += 1
            finally:
                if node.connected:  # the controller had accepted it
                    attempt = 0
                node.connected = False
            await asyncio.sleep(self.backoff.delay(attempt))
            attempt += 1

    async def _session(self, node: Node, storm: bool) -> None:
        """One stream: Hello, wait for the controller's answer, then frames and acks until it ends."""
        channel = self.channel or grpc.aio.insecure_channel(self.target, options=NODE_CHANNEL_OPTIONS)
        try:
            stream = channel.stream_stream(METHOD, _as_is, pb.ControllerMessage.FromString)
            call = stream()  # type: ignore[call-arg] # aio: no iterator, call.write
            began = time.perf_counter()
            await call.write(hello_message(node.archetype, node.name, node.boot, self.epoch))
            await asyncio.wait_for(call.initial_metadata(), HELLO_TIMEOUT_S)
            accepted = node.accepted = time.perf_counter()
            self.window.connects.append(accepted - began)
            if storm and self.storm is not None:
                self.storm.reconnect.append(accepted - self.storm.began)
                self.storm.answer.append(accepted - began)
            node.connected = True
            # Frames not acked when the last stream ended go again (the controller drops duplicates).
            node.sent.clear()
            node.seq = node.acked
            await self._stream(node, call, storm)
        finally:
            if self.channel is None:
                await channel.close(None)

    async def _stream(self, node: Node, call: Any, storm: bool) -> None:
        reader = asyncio.create_task(self._read(node, call))
        sender = asyncio.create_task(self._send(node, call, storm))
        try:
            done, _ = await asyncio.wait({reader, sender}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # the error that ended the stream
        finally:
            for task in (reader, sender):
                task.cancel()
            await asyncio.gather(reader, sender, return_exceptions=True)
            call.cancel()

    async def _send(self, node: Node, call: Any, storm: bool) -> None:
        if storm:  # the agent resends its spool at once after reconnecting
            node.storm_sent = time.perf_counter()
            node.storm_seq = await self._write(node, call, 0.0)
        while True:
            slot, due = self._next_slot(node)
            await asyncio.sleep(max(0.0, due - time.time()))
            node.slot = slot
            await self._write(node, call, time.time() - due)

    def _next_slot(self, node: Node) -> tuple[int, float]:
        """The node's next schedule slot after the last one sent (none in the past), and its time."""
        now = time.time()
        slot = max(node.slot + 1, math.ceil((now - self.epoch - node.phase) / self.spec.interval))
        return slot, self.epoch + node.phase + slot * self.spec.interval

    async def _write(self, node: Node, call: Any, lag: float) -> int:
        seq = max(node.seq, node.acked) + 1
        node.seq = seq
        now = time.time()
        message = frame_message(node.archetype, node.name, node.boot, seq=seq, floor=node.acked + 1, now=now)
        node.sent.append((seq, time.perf_counter()))
        if node.failing_over and not node.storm_seq:  # a stream kept through a failover: back once acked
            node.storm_seq, node.storm_sent = seq, node.sent[-1][1]
        self.window.sent += 1
        self.window.lags.append(lag)
        await call.write(message)
        return seq

    async def _read(self, node: Node, call: Any) -> None:
        async for message in call:
            kind = message.WhichOneof("msg")
            if kind == "ack":
                self._acked(node, message.ack.seq)
            elif kind == "command":
                self.window.commands += 1

    def _acked(self, node: Node, seq: int) -> None:
        now = time.perf_counter()
        node.acked = max(node.acked, seq)
        while node.sent and node.sent[0][0] <= seq:
            _, sent = node.sent.popleft()
            self.window.latencies.append(now - sent)
            self.window.acked += 1
        if node.storm_seq and seq >= node.storm_seq and self.storm is not None and not node.back:
            node.back = True
            self.storm.first_ack.append(now - node.storm_sent)
            self.storm.since_storm.append(now - self.storm.began)
            if node.accepted >= self.storm.began:
                self.storm.moved.append(now - self.storm.began)
            else:
                self.storm.kept.append(now - node.storm_sent)
            node.storm_seq = 0
            node.failing_over = False  # back: a stream ended before its first ack came counts again


def _as_is(message: bytes) -> bytes:
    """The request serializer: messages are built as bytes already (templates.py)."""
    return message


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


def _kind(exc: BaseException) -> str:
    """What kind of failure, for the tally: _describe without its numbers (ports, addresses, times)."""
    return re.sub(r"\d+", "N", _describe(exc))[:100]


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """The worker process's entry point (multiprocessing, spawn)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends the run; a ^C reaches it too
    with contextlib.suppress(BrokenPipeError):
        asyncio.run(Worker(spec, conn).main())
