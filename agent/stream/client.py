"""The agent's side of the Telemetry stream: Hello, spooled frames in order, acks and commands.

The client never blocks sampling: frames wait in the spool while the controller is away, and each
reconnect resends everything not yet acked (the controller drops duplicates). Every failed attempt
logs one line and waits a capped, jittered, growing delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import grpc

from agent.stream.backoff import Backoff
from agent.stream.spool import Spool
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc

CommandHandler = Callable[[pb.Command], Awaitable[pb.CommandResult]]

# Keepalive finds a dead controller (or a silently dropped connection) within about 40 s.
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
]


class StreamClient:
    def __init__(
        self,
        target: str,
        spool: Spool,
        hello: Callable[[], pb.Hello],
        on_command: CommandHandler,
        *,
        backoff: Backoff | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self.target = target
        self.spool = spool
        self.hello = hello
        self.on_command = on_command
        self.backoff = backoff or Backoff()
        self.log = log or logging.getLogger("gpufleet.agent.stream")
        self.connected = False
        self._wake = asyncio.Event()
        self._outbox: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        self._commands: set[asyncio.Task[None]] = set()

    def notify(self) -> None:
        """A frame was appended to the spool: wake the sender."""
        self._wake.set()

    def command_started(self, command_id: str) -> None:
        """Tell the controller a command began (its state `running`); sent on the next connection."""
        self._outbox.put_nowait(pb.AgentMessage(command_started=pb.CommandStarted(command_id=command_id)))
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Stream until `stop` is set, reconnecting as needed."""
        attempt = 0
        while not stop.is_set():
            heard = False
            try:
                heard = await self._session(stop)
                reason = "stream closed by the controller"
            except grpc.aio.AioRpcError as exc:
                heard = heard or self.connected
                reason = f"{exc.code().name}: {exc.details()}"
            except asyncio.InvalidStateError as exc:  # a write raced the end of the RPC (controller gone)
                heard = heard or self.connected
                reason = f"stream ended: {exc}"
            finally:
                self.connected = False
            if stop.is_set():
                break
            if heard:
                attempt = 0
            delay = self.backoff.delay(attempt)
            attempt += 1
            self.log.warning(
                "controller %s: %s; retry %d in %.1fs (%d frames spooled)",
                self.target,
                reason,
                attempt,
                delay,
                len(self.spool),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
        for task in list(self._commands):
            task.cancel()

    async def _session(self, stop: asyncio.Event) -> bool:
        """One connection; returns whether the controller answered before the stream ended."""
        async with grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS) as channel:
            call = telemetry_pb2_grpc.TelemetryStub(channel).Stream()  # type: ignore[call-arg] # aio: no iterator
            await call.write(pb.AgentMessage(hello=self.hello()))
            sender = asyncio.create_task(self._send(call))
            stopper = asyncio.create_task(stop.wait())
            reader = asyncio.create_task(self._receive(call))
            try:
                done, _ = await asyncio.wait({sender, reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if stopper in done:
                    await call.done_writing()
                    return self.connected
                for task in done:
                    task.result()  # re-raise the RPC error that ended the session
                return self.connected
            finally:
                for task in (sender, reader, stopper):
                    task.cancel()
                await asyncio.gather(sender, reader, stopper, return_exceptions=True)
                call.cancel()

    async def _receive(self, call: grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControllerMessage]) -> None:
        async for msg in call:
            if not self.connected:
                self.connected = True
                self.log.info("connected to controller %s", self.target)
            kind = msg.WhichOneof("msg")
            if kind == "ack":
                self.spool.ack(msg.ack.boot_id, msg.ack.seq)
            elif kind == "command":
                task = asyncio.create_task(self._run_command(msg.command))
                self._commands.add(task)
                task.add_done_callback(self._commands.discard)
            else:
                self.log.warning("ignoring a controller message this agent does not understand")

    async def _run_command(self, command: pb.Command) -> None:
        try:
            result = await self.on_command(command)
        except Exception as exc:  # a failing command must not end the stream
            self.log.exception("command %s failed", command.id)
            result = pb.CommandResult(command_id=command.id, ok=False, error=str(exc))
        await self._outbox.put(pb.AgentMessage(command_result=result))
        self._wake.set()

    async def _send(self, call: grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControllerMessage]) -> None:
        cursor = -1
        while True:
            while not self._outbox.empty():
                await call.write(self._outbox.get_nowait())
            entry = self.spool.next_after(cursor)
            if entry is None:
                self._wake.clear()
                entry = self.spool.next_after(cursor)
                if entry is None and self._outbox.empty():
                    await self._wake.wait()
                    continue
            if entry is not None:
                entry.frame.spool_floor_seq = self.spool.floor(entry.boot_id)
                await call.write(pb.AgentMessage(frame=entry.frame))
                cursor = entry.ordinal
