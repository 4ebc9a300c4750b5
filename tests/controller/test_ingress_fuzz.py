"""A property-based fuzz of the controller's ingress (issue 15): generated Hellos, frames, command
answers and random bytes, driven through the stream servicer's read path (the same decode and
ingest calls a real stream makes) into a ControllerApp that holds a healthy simulated fleet.

Properties, after every generated batch:
- only ControllerError subclasses come out (a stream would end INVALID_ARGUMENT, OUT_OF_RANGE, ...;
  never INTERNAL);
- the store and the fleet agree (every acked position as stored), a later valid frame of the fuzzed
  node is acked, and a healthy node's next frame too;
- what is stored converts to JSON (`gpufleet node fuzz -o json`);
- no verdict is poisoned: a detection pass finds nothing on the healthy nodes.

Deterministic (derandomized, no example database) and quick: a modest number of examples.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
from collections.abc import Callable
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.app import ControllerApp
from controller.cli.jsonify import message_to_dict
from controller.config import DetectConfig
from controller.errors import ControllerError
from controller.ingest_checks import EARLIEST
from controller.operator_api import OperatorServicer
from controller.servicer import EOF, Reading, StreamWrites, TelemetryServicer
from protos.gpufleet.v1 import operator_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import Clock, config
from tests.simfleet import SimFleet

FUZZ = "fuzz"  # the node the generated messages speak for (its stream's node)
HEALTHY = 6
WINDOW = 5.0
EXAMPLES = 80

U64 = [0, 1, 2, 2**31 - 1, 2**32 - 1, 2**48, 2**48 + 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]
U32 = [0, 1, 7, 8, 2**31 - 1, 2**32 - 1]
I64 = [0, -1, 1, 2**62, -(2**62), 2**63 - 1, -(2**63), EARLIEST - 1, EARLIEST]
I32 = [0, -1, 1, 2**31 - 1, -(2**31), 999_999_999, 1_000_000_000]
FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, -1e308, 5e-324, 1e9, -1.0, 700.0]
TEXT = ["", "[/]", "[bold red]x", "\x1b]52;c;aGk=\x07", "\x1b[2J", "a\nb", "\x00", "é" * 300, "x" * 70_000]

floats = st.one_of(st.sampled_from(FLOATS), st.floats())
texts = st.one_of(st.sampled_from(TEXT), st.text(max_size=40))


@functools.cache
def scalar(kind: int) -> st.SearchStrategy[Any]:
    """Values for a scalar field of this FieldDescriptor type: the edges, and anything."""
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return floats
    if kind == FieldDescriptor.TYPE_UINT64:
        return st.one_of(st.sampled_from(U64), st.integers(0, 2**64 - 1))
    if kind == FieldDescriptor.TYPE_UINT32:
        return st.one_of(st.sampled_from(U32), st.integers(0, 2**32 - 1))
    if kind in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64):
        return st.one_of(st.sampled_from(I64), st.integers(-(2**63), 2**63 - 1))
    if kind in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_ENUM):
        return st.one_of(st.sampled_from(I32), st.integers(-(2**31), 2**31 - 1))
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_STRING:
        return texts
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    raise AssertionError(f"no strategy for field type {kind}")


@functools.cache
def some_fields(desc: Descriptor) -> st.SearchStrategy[list[FieldDescriptor]]:
    return st.lists(st.sampled_from(list(desc.fields)), max_size=6, unique_by=lambda f: f.name)


@st.composite
def message(draw: st.DrawFn, desc: Descriptor, depth: int = 2) -> Message:
    """Any message of `desc`: a few of its fields set, each to an edge or a random value."""
    msg: Message = pb.AgentMessage() if desc is pb.AgentMessage.DESCRIPTOR else _new(desc)
    for field in draw(some_fields(desc)):
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            key, value = sub.fields_by_name["key"], sub.fields_by_name["value"]
            entries = st.dictionaries(scalar(key.type), scalar(value.type), max_size=3)
            getattr(msg, field.name).update(draw(entries))
        elif sub is not None:
            if sub.full_name == "google.protobuf.Timestamp":
                items: list[Message] = [draw(timestamp())]
            elif depth == 0:
                continue
            else:
                items = draw(st.lists(message_of(sub, depth - 1), min_size=1, max_size=3))
            if field.is_repeated:
                getattr(msg, field.name).extend(items)
            else:
                getattr(msg, field.name).CopyFrom(items[0])
        elif field.is_repeated:
            getattr(msg, field.name).extend(draw(st.lists(scalar(field.type), max_size=3)))
        else:
            setattr(msg, field.name, draw(scalar(field.type)))
    return msg


@functools.cache
def message_of(desc: Descriptor, depth: int) -> st.SearchStrategy[Message]:
    return message(desc, depth)


def _new(desc: Descriptor) -> Message:
    return message_factory.GetMessageClass(desc)()


@st.composite
def timestamp(draw: st.DrawFn) -> Timestamp:
    ts = Timestamp()
    ts.seconds = draw(st.one_of(st.sampled_from(I64), st.integers(EARLIEST - 10, 2_000_000_000)))
    ts.nanos = draw(st.one_of(st.sampled_from(I32), st.integers(0, 999_999_999)))
    return ts


@st.composite
def fuzzed_frame(draw: st.DrawFn) -> tuple[pb.TelemetryFrame, str]:
    """A frame with anything in it, and how its identity is steered: 'next' (the fuzzed node's next
    expected seq and a valid time, so that wild readings reach the store) or 'as-drawn'."""
    frame = draw(message_of(pb.TelemetryFrame.DESCRIPTOR, 2))
    assert isinstance(frame, pb.TelemetryFrame)
    frame.node = draw(st.one_of(st.just(FUZZ), st.just("node-00"), texts))
    frame.boot_id = draw(st.one_of(st.just("b1"), st.just("b2"), texts))
    if draw(st.booleans()):  # GPUs with many readings each, on mostly plausible indices
        del frame.gpus[:]
        for i in range(draw(st.integers(0, 3))):
            gpu = frame.gpus.add()
            gpu.MergeFromString(draw(message_of(pb.GpuSample.DESCRIPTOR, 2)).SerializeToString())
            gpu.index = draw(st.one_of(st.just(i), st.sampled_from(U32)))
    if draw(st.booleans()):  # probe results of known kinds, with wild values and times
        del frame.probes[:]
        for _ in range(draw(st.integers(1, 3))):
            probe = frame.probes.add()
            probe.MergeFromString(draw(message_of(pb.ProbeResult.DESCRIPTOR, 1)).SerializeToString())
            probe.probe = draw(st.one_of(st.sampled_from(["gemm", "membw"]), texts))
            probe.variant = draw(st.one_of(st.sampled_from(["bf16", "d2d"]), texts))
            probe.gpu = draw(st.one_of(st.integers(0, 7), st.sampled_from(U32)))
            probe.value = draw(floats)
            probe.error = draw(st.sampled_from(["", "", "CUDA error"]))
            probe.time.CopyFrom(draw(timestamp()))
    steer = draw(st.sampled_from(["next", "next", "next", "as-drawn"]))
    return frame, steer


frames = st.tuples(st.just("frame"), fuzzed_frame(), st.just(""))
# A valid frame at a spool floor at an edge: the forged-position attempt.
JUMPS = [2**24, 2**48 + 1, 2**63 - 1, 2**63, 2**64 - 1]
jumps = st.tuples(st.just("jump"), st.sampled_from(JUMPS), st.sampled_from(["b1", "b2"]))
agent_messages = st.one_of(
    frames,
    frames,
    jumps,
    st.tuples(st.just("hello"), message(pb.Hello.DESCRIPTOR), st.one_of(st.just("b1"), st.just("b2"), texts)),
    st.tuples(st.just("agent"), message(pb.AgentMessage.DESCRIPTOR, depth=3), st.just("")),
    st.tuples(st.just("bytes"), st.binary(max_size=300), st.just("")),
)


class Harness:
    """A started ControllerApp whose fleet holds HEALTHY simulated nodes, fed through the app's
    own ingest; the fuzzed node FUZZ said Hello with the same GPU model as theirs."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sim = SimFleet(HEALTHY)
        self.clock = Clock(self.sim.now)
        cfg = config(detect=DetectConfig(throttle_window_seconds=WINDOW))
        self.app = ControllerApp(cfg, clock=self.clock)
        self.servicer = TelemetryServicer(self.app)
        self.valid = 0
        self.template = pb.TelemetryFrame()

    async def start(self) -> None:
        await self.app.start()
        for name in self.sim.sims:
            await self.app.ingest.hello(self.sim.hello(name))
        await self.app.ingest.hello(self.fuzz_hello())
        await self.step(probes=True)
        for _ in range(int(WINDOW) + 2):
            await self.step()
        self.template = self.sim.frame("node-00")  # a valid frame for FUZZ, at the clock's now
        self.sim.seq["node-00"] -= 1

    def fuzz_hello(self, boot: str = "b1") -> pb.Hello:
        hello = self.sim.hello("node-00")
        hello.node, hello.boot_id = FUZZ, boot
        return hello

    async def step(self, *, probes: bool = False) -> None:
        """One second on; every healthy node's next frame, acked."""
        self.sim.now += 1.0
        self.clock.now = self.sim.now
        for name in self.sim.sims:
            frame = self.sim.frame(name, probes=probes)
            assert await self.app.ingest.frame(name, frame) == frame.seq

    async def read(self, context: OneMessage) -> None:
        """The servicer's read loop on FUZZ's stream, as after its Hello."""
        await self.servicer._read(context, FUZZ, StreamWrites(context, asyncio.Event()), Reading())

    async def feed(self, kind: str, item: Any, boot: str) -> None:
        if kind == "hello":
            hello = pb.Hello()
            hello.CopyFrom(item)
            hello.node = FUZZ  # a Hello for a healthy node would change the healthy set itself
            hello.boot_id = boot
            await self.app.ingest.hello(hello)
        elif kind == "frame":
            frame, steer = item
            if steer == "next":
                frame.node = FUZZ
                frame.time.FromSeconds(int(self.clock.now) - 1)
                frame.seq = self.app.fleet.acked.get((FUZZ, frame.boot_id), 0) + 1
                frame.spool_floor_seq = 0
            await self.read(OneMessage(lambda: pb.AgentMessage(frame=frame)))
        elif kind == "jump":
            frame = pb.TelemetryFrame()
            frame.CopyFrom(self.template)
            frame.node, frame.boot_id, frame.seq, frame.spool_floor_seq = FUZZ, boot, item, item
            await self.read(OneMessage(lambda: pb.AgentMessage(frame=frame)))
        elif kind == "agent":
            await self.read(OneMessage(lambda: item))
        else:
            await self.read(OneMessage(lambda: pb.AgentMessage.FromString(item)))

    async def check(self, batch: list[tuple[str, Any, str]]) -> None:
        for kind, item, boot in batch:
            with contextlib.suppress(ControllerError):  # a clear status; anything else fails the test
                await self.feed(kind, item, boot)
        # A later valid frame of the fuzzed node is acked (a fresh boot: the fuzz may own b1's position).
        self.valid += 1
        boot = f"valid-{self.valid}"
        await self.app.ingest.hello(self.fuzz_hello(boot))
        frame = pb.TelemetryFrame()
        frame.CopyFrom(self.template)
        frame.node, frame.boot_id, frame.seq = FUZZ, boot, 1
        assert await self.app.ingest.frame(FUZZ, frame) == 1
        # And a healthy node's next frame (one node each time: the simulator is not free).
        name = f"node-{self.valid % HEALTHY:02d}"
        healthy = self.sim.frame(name)
        assert await self.app.ingest.frame(name, healthy) == healthy.seq
        stored, _ = await self.app.store.load()
        assert stored.acked == {key: seq for key, seq in self.app.fleet.acked.items() if seq}
        detail = await OperatorServicer(self.app).GetNode(operator_pb2.GetNodeRequest(name=FUZZ), None)  # type: ignore[arg-type]
        json.dumps(message_to_dict(detail), allow_nan=False)
        await self.app.detection_pass()
        poisoned = sorted({s.finding.node for s in self.app.active.values()} - {FUZZ})
        assert poisoned == [], f"findings on healthy nodes after fuzzed input: {poisoned}"


class OneMessage:
    """A stream's context as the servicer reads it after the Hello: one message, then the end.
    `make` gives the message, as gRPC's deserializer would (bytes that do not parse raise
    DecodeError from read, as on a real stream)."""

    def __init__(self, make: Callable[[], Message]) -> None:
        self.make: Callable[[], Message] | None = make

    async def read(self) -> object:
        make, self.make = self.make, None
        if make is None:
            return EOF
        message = make()
        assert isinstance(message, pb.AgentMessage)
        return message

    async def write(self, message: pb.ControllerMessage) -> None:
        """Acks go nowhere: the fuzz checks the controller's state, not its answers."""


def run_fuzz(check: Callable[[Harness, list[tuple[str, Any, str]]], Any]) -> None:
    loop = asyncio.new_event_loop()
    harness = Harness(loop)
    try:
        loop.run_until_complete(harness.start())
        loop.run_until_complete(harness.app.detection_pass())
        assert harness.app.active == {}, "the healthy fleet already has findings"

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(st.lists(agent_messages, min_size=1, max_size=6))
        def fuzz(batch: list[tuple[str, Any, str]]) -> None:
            loop.run_until_complete(check(harness, batch))

        fuzz()
    finally:
        harness.app.close()
        loop.close()


def test_fuzzed_ingress_never_crashes_and_never_poisons_a_verdict() -> None:
    run_fuzz(Harness.check)
