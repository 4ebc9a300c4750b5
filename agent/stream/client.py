"""The agent's side of the Telemetry stream: Hello, spooled frames in order, acks and commands.

The client never blocks sampling: frames wait in the spool while the controller is away, and each
reconnect resends everything not yet acked (the controller drops duplicates). Every failed attempt
logs one line and waits a capped, jittered, growing delay.

Permanent errors are told from transient ones. A frame the controller refuses for good (INVALID_ARGUMENT
naming the frame in trailing metadata, protos/refusal.py), and a frame that can never be sent (bigger
than max_message_bytes, or made under another node name than the Hello's) is set aside
(Spool.set_aside: kept in <spool>/rejected/, counted, logged once) and the stream goes on at once. A
controller that answers RESOURCE_EXHAUSTED for a message over its own, smaller limit lowers this
client's limit to it. Everything else (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, INTERNAL, ...) keeps
the backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable

import grpc

from agent.stream.backoff import Backoff
from agent.stream.spool import Spool
from agent.stream.status import StreamStatus
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc
from protos.refusal import refused_frame
from protos.transport import ClientTls, TransportError

CommandHandler = Callable[[pb.Command], Awaitable[pb.CommandResult]]

# The largest AgentMessage sent: the controller's max_message_bytes default. gRPC itself refuses a
# bigger one (RESOURCE_EXHAUSTED), and resending it could never succeed.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
HELLO_ANSWER_SECONDS = 2.0  # frames wait at most this long for the controller to accept the Hello
STATUS_WAIT_SECONDS = 2.0  # after a failed write, how long the call's own status is awaited
_TOO_LARGE = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")  # gRPC's words for a message over the limit

# Keepalive finds a dead controller (or a silently dropped connection) within about 40 s.
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.ping_timeout_ms", 10_000),  # gRPC core waits this (default 60 s) for a ping's answer
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    # No bandwidth-delay probe (a PING) per ack received: the controller answers each one, and the
    # acks and commands are small (controller/listeners.py NO_BDP_PROBE).
    ("grpc.http2.bdp_probe", 0),
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
        tls: ClientTls | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.target = target
        self.spool = spool
        self.hello = hello
        self.on_command = on_command
        self.backoff = backoff or Backoff()
        self.log = log or logging.getLogger("gpufleet.agent.stream")
        self.connected = False
        self.last_ack_time: float | None = None  # Unix time of the latest ack (the /metrics page)
        self.max_message_bytes = max_message_bytes  # larger frames are set aside, never sent
        self._node = ""  # the node name of the session's Hello: frames made under another are set aside
        self._acked = asyncio.Event()  # set on every ack
        # Mutual TLS: the files are read at each connection; a change of them (looked for every
        # rotation_check_seconds while connected) ends the session cleanly to reconnect with them.
        self.tls = tls
        self.rotation_check_seconds = 30.0
        self._signature = tls.signature() if tls is not None else ()
        self._rotated = False
        self._wake = asyncio.Event()
        self._outbox: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        self._commands: set[asyncio.Task[None]] = set()

    @property
    def rejected(self) -> int:
        """Frames set aside since start: refused by the controller for good, or unsendable."""
        return self.spool.rejected

    def status(self) -> StreamStatus:
        """Where the stream stands now, for the /metrics page (read from the exporter's thread)."""
        spool = self.spool
        return StreamStatus(
            controller=self.target,
            connected=self.connected,
            last_ack_time=self.last_ack_time,
            spooled=len(spool),
            max_frames=spool.max_frames,
            on_disk=spool.persistent if spool.directory is not None else None,
            dropped=spool.dropped,
            rejected=spool.rejected,
        )

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
            again = False  # a frame was set aside: go on at once
            try:
                heard = await self._session(stop)
                reason = "stream closed by the controller"
            except grpc.aio.AioRpcError as exc:
                heard = heard or self.connected
                again = self._permanent(exc)
                reason = f"{exc.code().name}: {exc.details()}{self._plaintext_hint(exc)}"
            except asyncio.InvalidStateError as exc:  # a write raced the end of the RPC (controller gone)
                heard = heard or self.connected
                reason = f"stream ended: {exc}"
            except TransportError as exc:  # a TLS file is missing or broken: said, retried, frames kept
                reason = f"TLS: {exc}"
            finally:
                self.connected = False
            if stop.is_set():
                break
            if self._rotated:  # new TLS files: reconnect with them at once
                self._rotated = False
                continue
            if again:
                attempt = 0
                continue
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
        async with self._channel() as channel:
            call = telemetry_pb2_grpc.TelemetryStub(channel).Stream()  # type: ignore[call-arg] # aio: no iterator
            hello = self.hello()
            self._node = hello.node
            await call.write(pb.AgentMessage(hello=hello))
            sender = asyncio.create_task(self._send(call))
            stopper = asyncio.create_task(stop.wait())
            reader = asyncio.create_task(self._receive(call))
            rotation = asyncio.create_task(self._watch_rotation())
            try:
                done, _ = await asyncio.wait(
                    {sender, reader, stopper, rotation}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopper in done or rotation in done:
                    await call.done_writing()
                    return self.connected
                if reader not in done:
                    # A write that failed because the RPC ended: the reader is about to see the
                    # controller's own status (a refusal), which says more than the writer's error.
                    await asyncio.wait({reader}, timeout=STATUS_WAIT_SECONDS)
                    if reader.done():
                        done = {*done, reader}
                for task in sorted(done, key=lambda t: t is not reader):
                    task.result()  # re-raise the RPC error that ended the session, the reader's first
                return self.connected
            finally:
                for task in (sender, reader, stopper, rotation):
                    task.cancel()
                await asyncio.gather(sender, reader, stopper, rotation, return_exceptions=True)
                call.cancel()

    def _channel(self) -> grpc.aio.Channel:
        """A channel to the controller: TLS from the files as they are now, else plaintext (the config
        allowed it: loopback, or --insecure; agent/compose/stream.py warned)."""
        if self.tls is not None:
            self._signature = self.tls.signature()  # before reading: a change while reading is seen
            credentials = self.tls.credentials()
            return grpc.aio.secure_channel(self.target, credentials, options=CHANNEL_OPTIONS)
        return grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)

    def _permanent(self, exc: grpc.aio.AioRpcError) -> bool:
        """Whether `exc` was a permanent error about one frame, now dealt with: the frame the controller
        refused is set aside, or its smaller message limit adopted."""
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            named = refused_frame(exc.trailing_metadata())
            return named is not None and self.spool.set_aside(*named, f"refused by the controller: {details}")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            too_large = _TOO_LARGE.search(details)
            if too_large is not None and 0 < int(too_large.group(2)) < self.max_message_bytes:
                self.max_message_bytes = int(too_large.group(2))
                self.log.warning(
                    "controller %s accepts messages of at most %d bytes: larger frames are set aside",
                    self.target,
                    self.max_message_bytes,
                )
                return True
        return False

    def _unsendable(self, frame: pb.TelemetryFrame, size: int) -> str:
        """Why `frame` can never be delivered on this stream ('' if it can)."""
        if size > self.max_message_bytes:
            return f"{size} bytes, over the {self.max_message_bytes}-byte message limit"
        if frame.node != self._node:
            return f"made as node {frame.node!r}; this agent is now node {self._node!r}"
        return ""

    def _plaintext_hint(self, exc: grpc.aio.AioRpcError) -> str:
        """A controller that requires TLS closes a plaintext connection at once: say what to do."""
        closed = exc.code() == grpc.StatusCode.UNAVAILABLE and "Socket closed" in (exc.details() or "")
        if self.tls is None and closed:
            return " (if the controller requires TLS, give --tls-ca, --tls-cert and --tls-key)"
        return ""

    async def _watch_rotation(self) -> None:
        """Return when the TLS files changed since the channel read them (never without TLS)."""
        if self.tls is None:
            await asyncio.Event().wait()
            return
        while True:
            await asyncio.sleep(self.rotation_check_seconds)
            if self.tls.signature() != self._signature:
                self.log.info("TLS files changed: reconnecting to controller %s with them", self.target)
                self._rotated = True
                return

    async def _receive(self, call: grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControllerMessage]) -> None:
        async for msg in call:
            if not self.connected:
                self.connected = True
                self.log.info("connected to controller %s", self.target)
            kind = msg.WhichOneof("msg")
            if kind == "ack":
                self.spool.ack(msg.ack.boot_id, msg.ack.seq)
                self.last_ack_time = time.time()
                self._acked.set()
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
        # The controller answers a Hello it accepts with its initial metadata; frames wait for it, so
        # that a refused Hello ends the call with the controller's own status (PERMISSION_DENIED, ...)
        # rather than a write racing the refusal (which grpc.aio reports as INTERNAL). A controller
        # that sends none: the frames go after a short wait.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(call.initial_metadata(), HELLO_ANSWER_SECONDS)
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
                message = pb.AgentMessage(frame=entry.frame)
                cursor = entry.ordinal
                why = self._unsendable(entry.frame, message.ByteSize())
                if not why:
                    await call.write(message)
                    continue
                self.spool.set_aside(entry.boot_id, entry.seq, why)
                # The frames of its boot sent before it must be acked before a later one goes: the
                # later one's spool floor then skips the hole (otherwise: a sequence gap).
                while 0 < self.spool.floor(entry.boot_id) < entry.seq:
                    self._acked.clear()
                    await self._acked.wait()
