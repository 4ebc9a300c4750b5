"""The controller's side of its ingest fronts (front.py, `ingest_fronts: N`): it starts N front
processes on the agents' port and serves every stream they relay with the same TelemetryServicer
as a stream of its own, through a context that stands in for gRPC's (peer, the TLS auth context the
front saw, initial metadata, abort). Checks, identity, storage, acks, the command channel, probes
and recording are therefore unchanged; a node's commands go to whichever front holds its stream.

The controller's event loop then does no gRPC work for agents: it reads the fronts' pipes (one
read carries many messages), parses each message and serializes each answer. Most frames come
planned (planner.py): the answer to a Hello carries the node's state, the front checks and plans
each next frame from it, and the controller parses the screened frame once and takes the plan as
it is. A front that dies ends its streams (their agents reconnect, to the other fronts) and is
started again on the same port after RESTART_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pickle
import sys
import time
from typing import Any

import grpc

from controller import children
from controller.batched_writes import BatchedWriter
from controller.event_loop import ENV, kind, read_transport, write_transport
from controller.fronts import wire
from controller.fronts.planner import planned_parts, state_of
from controller.ingest import PlannedFrame
from controller.interceptors import guarded
from controller.listeners import refuse_if_taken
from controller.pipe_sizes import widen
from controller.servicer import EOF, AgentMessage, TelemetryServicer
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.fronts")
START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 5.0
RESTART_SECONDS = 1.0
HIGH_WATER_BYTES = 64 * 1024 * 1024  # agent messages waiting per front before its pipe is paused
METHOD = "/gpufleet.v1.Telemetry/Stream"


class RelayContext:
    """What TelemetryServicer.Stream and the error mapping use of a gRPC servicer context: the
    stream's messages as the front relayed them (`queue`, None once the agent half-closed it) read,
    its answers written to the front."""

    def __init__(
        self,
        front: FrontProcess,
        sid: int,
        peer: str,
        auth: dict[str, list[bytes]],
        queue: asyncio.Queue[tuple[int, bytes] | None],
    ) -> None:
        self.front, self.sid, self._peer, self._auth = front, sid, peer, auth
        self.queue = queue
        self.closed = False
        self.ended = False  # the agent half-closed the stream
        self.hello: pb.Hello | None = None  # the stream's first message, when a Hello

    async def read(self) -> AgentMessage | object:
        """The next message, or EOF (as gRPC's): bytes that do not parse raise DecodeError (the
        servicer answers INVALID_ARGUMENT); the frames the front planned come as PlannedFrames."""
        item = None if self.ended else await self.queue.get()
        if item is None:
            self.ended = True
            return EOF
        kind, raw = item
        self.front.consumed(len(raw))
        if kind == wire.PLANNED:
            plan, frame = planned_parts(raw)
            self.front.fronts.planned += 1
            return PlannedFrame(pb.TelemetryFrame.FromString(frame), plan, frame)
        message = pb.AgentMessage.FromString(raw)
        if self.hello is None and message.WhichOneof("msg") == "hello":
            self.hello = message.hello
        return message

    async def write(self, message: pb.ControllerMessage) -> None:
        if not self.closed:
            self.front.send(wire.record(wire.SEND, self.sid, message.SerializeToString()))

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    async def send_initial_metadata(self, metadata: Any) -> None:
        """The Hello is accepted: with it goes the node's state as ingest holds it now, for the front
        to plan the stream's frames from (planner.py)."""
        self.front.send(wire.record(wire.ACCEPT, self.sid, self._plan_state()))

    def _plan_state(self) -> bytes:
        """Empty (the controller plans each frame itself) unless its ingest reads the wall clock, as
        the front does: a test's clock would make the front's checks and clamps differ."""
        ingest = self.front.fronts.servicer.app.ingest
        fleet = ingest.fleet
        node = None if self.hello is None else fleet.nodes.get(self.hello.node)
        if node is None or self.hello is None or ingest.clock is not time.time:
            return b""
        boot_id = self.hello.boot_id
        acked = fleet.acked.get((node.name, boot_id), 0)
        state = state_of(node, boot_id, acked, ingest.max_clock_skew_seconds)
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self.close(code, details, trailing_metadata)
        raise grpc.aio.AbortError()

    def close(self, code: grpc.StatusCode, details: str = "", metadata: Any = ()) -> None:
        if not self.closed:
            self.closed = True
            self.front.send(wire.close_record(self.sid, code, details, metadata))


class FrontProcess(asyncio.SubprocessProtocol):
    """One front: its pipes, and the streams it relays (stream id -> their queue and task)."""

    def __init__(self, fronts: Fronts, index: int) -> None:
        self.fronts, self.index = fronts, index
        self.records = wire.Records(self.on_record)
        self.streams: dict[int, tuple[asyncio.Queue[tuple[int, bytes] | None], asyncio.Task[None]]] = {}
        loop = asyncio.get_running_loop()
        self.port: asyncio.Future[int] = loop.create_future()
        self.exited: asyncio.Future[int | None] = loop.create_future()
        self.transport: asyncio.SubprocessTransport | None = None
        self.lost = 0  # streams it held when it ended
        self.pipe_bytes = (0, 0)  # the capacity of its stdin and stdout pipes
        # Bytes of agent messages received and not yet taken by their stream. Past fronts.high_water
        # the front's pipe is no longer read until they fall under half of it: the front's writes
        # then wait, it stops reading its agents, and gRPC's flow control holds them back. A
        # controller behind its fleet so holds a bounded backlog instead of all of it.
        self.queued = 0
        self.paused = False
        self.pauses = 0
        self._stdin: BatchedWriter | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)  # children.SubprocessTransport
        self.transport = transport
        stdin, stdout = self.transport.get_pipe_transport(0), self.transport.get_pipe_transport(1)
        assert stdout is not None
        writer = write_transport(stdin)  # asyncio's or uvloop's
        self._stdin = BatchedWriter(writer)
        self.pipe_bytes = (widen(writer), widen(stdout))  # the agents' bytes and the answers

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        assert isinstance(data, bytes)
        self.records.feed(data)

    def process_exited(self) -> None:
        assert self.transport is not None
        code = self.transport.get_returncode()
        self.lost = len(self.streams)
        for _, task in self.streams.values():  # their agents' connections went with the process
            task.cancel()
        if not self.port.done():
            why = f"ingest front {self.index} ended with status {code} before listening"
            self.port.set_exception(OSError(why))
        if not self.exited.done():
            self.exited.set_result(code)

    @property
    def alive(self) -> bool:
        return self.port.done() and not self.port.exception() and not self.exited.done()

    @property
    def pid(self) -> int | None:
        return None if self.transport is None else self.transport.get_pid()

    def send(self, data: bytes) -> None:
        if self._stdin is not None and not self._stdin.is_closing():
            self._stdin.write(data)

    def close_input(self) -> None:
        if self._stdin is not None:
            self._stdin.close()

    def consumed(self, size: int) -> None:
        self.queued -= size
        if self.paused and self.queued <= self.fronts.high_water // 2:
            self.paused = False
            self._reading(True)

    def _reading(self, on: bool) -> None:
        """Take up or stop the front's records: the pipe is not read meanwhile, and records already
        read wait in `records` (at most one read's worth). Taking up again delivers those first,
        which may stop it again (the pipe then stays paused)."""
        pipe = None if self.transport is None else read_transport(self.transport.get_pipe_transport(1))
        if pipe is not None and not pipe.is_closing():
            if on:
                pipe.resume_reading()
            else:
                pipe.pause_reading()
        if on:
            self.records.release()
        else:
            self.records.hold()

    def on_record(self, kind: int, sid: int, payload: bytes) -> None:
        if kind in (wire.MSG, wire.PLANNED):
            entry = self.streams.get(sid)
            if entry is not None:
                entry[0].put_nowait((kind, payload))
                self.queued += len(payload)
                if not self.paused and self.queued > self.fronts.high_water:
                    self.paused = True
                    self.pauses += 1
                    self._reading(False)
        elif kind == wire.OPEN:
            peer, auth = wire.unpickled(payload)
            queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
            task = asyncio.create_task(self._serve(sid, queue, RelayContext(self, sid, peer, auth, queue)))
            self.streams[sid] = (queue, task)
        elif kind == wire.END:
            entry = self.streams.get(sid)
            if entry is not None:
                if payload:  # the agent's connection broke or was cancelled: as gRPC cancels a handler
                    entry[1].cancel()
                else:
                    entry[0].put_nowait(None)
        elif kind == wire.READY and not self.port.done():
            self.port.set_result(int(payload))

    async def _serve(
        self, sid: int, queue: asyncio.Queue[tuple[int, bytes] | None], context: RelayContext
    ) -> None:
        try:
            await guarded(self.fronts.servicer.Stream, None, context, METHOD)
            context.close(grpc.StatusCode.OK)
        except grpc.aio.AbortError:
            pass  # the context sent the status
        except asyncio.CancelledError:
            context.closed = True  # the front's side is gone, or the controller is stopping
        finally:
            self.streams.pop(sid, None)
            while not queue.empty():  # what the stream never took is no longer waiting
                left = queue.get_nowait()
                if left is not None:
                    self.consumed(len(left[1]))


class Fronts:
    """N front processes sharing the agents' port."""

    def __init__(
        self,
        servicer: TelemetryServicer,
        count: int,
        settings: wire.FrontSettings,
        *,
        high_water: int = HIGH_WATER_BYTES,
    ) -> None:
        self.servicer = servicer
        self.high_water = high_water
        self.count = count
        self.settings = settings
        self.running: list[FrontProcess] = []
        self.restarts = 0
        self.planned = 0  # frames the fronts planned (the others: planned here)
        self.address = settings.listen  # the bound one once started
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None

    @property
    def streams(self) -> int:
        return sum(len(front.streams) for front in self.running)

    async def start(self) -> str:
        """Start every front; the address they share (the first one's port when `listen` says 0)."""
        host = self.settings.listen.rpartition(":")[0]
        refuse_if_taken(self.settings.listen)
        first = await self._launch(0, self.settings.listen)
        address = f"{host}:{await self._listening(first)}"
        try:
            for index in range(1, self.count):
                await self._listening(await self._launch(index, address))
        except OSError:
            await self.stop()
            raise
        self.address = address
        self._watch = asyncio.create_task(self._keep_running())
        return address

    async def _launch(self, index: int, listen: str) -> FrontProcess:
        _, front = await children.subprocess_exec(
            lambda: FrontProcess(self, index),
            sys.executable,
            "-m",
            "controller.fronts.front",
            stderr=None,  # its log goes where the controller's goes
            env={**os.environ, ENV: kind()},  # it runs the controller's loop
        )
        settings = dataclasses.replace(self.settings, listen=listen)
        front.send(wire.pickled(wire.INIT, 0, settings))
        if index < len(self.running):  # one that ended: its pipes closed, its place taken
            ended = self.running[index]
            if ended.transport is not None:
                ended.transport.close()
            self.running[index] = front
        else:
            self.running.append(front)
        return front

    async def _listening(self, front: FrontProcess) -> int:
        try:
            return await asyncio.wait_for(asyncio.shield(front.port), START_TIMEOUT_SECONDS)
        except TimeoutError:
            why = f"ingest front {front.index} did not listen within {START_TIMEOUT_SECONDS:.0f} s"
            raise OSError(why) from None

    async def _keep_running(self) -> None:
        """Start a front again (on the shared port) when one ends while the controller runs."""
        while not self._stopping:
            waiting = {f.exited: f for f in self.running}  # the fronts' own futures: never cancelled here
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                front = waiting[future]
                if self._stopping:
                    return
                log.error(
                    "ingest front %d ended (status %s) with %d agent streams; starting it again",
                    front.index,
                    front.exited.result(),
                    front.lost,
                )
                await asyncio.sleep(RESTART_SECONDS)
                if self._stopping:
                    return
                self.restarts += 1
                with contextlib.suppress(OSError):  # logged by the next round if it ends again
                    await self._listening(await self._launch(front.index, self.address))

    async def stop(self) -> None:
        """End every front (their agents' connections close: they reconnect to the next controller)
        and every stream they relayed."""
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for front in self.running:
            front.close_input()
        for front in self.running:
            try:
                await asyncio.wait_for(asyncio.shield(front.exited), STOP_TIMEOUT_SECONDS)
            except TimeoutError:
                assert front.transport is not None
                front.transport.kill()
                await front.exited
        tasks = [task for front in self.running for _, task in front.streams.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for front in self.running:
            if front.transport is not None:
                front.transport.close()
