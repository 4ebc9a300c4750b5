"""controller/record_json.py against google.protobuf.json_format: the same line for every message and
the same message (or the same error) for every line, over fuzzed messages of every type a recording
holds (every field, extreme values, NaN and infinities, negative zero, unicode, maps, oneofs) and
over lines json_format reads specially or refuses."""

from __future__ import annotations

import contextlib
import json
import math
import random
from typing import Any

import pytest
from google.protobuf import descriptor, json_format
from google.protobuf.message import Message

from agent.sources.sim import FaultSpec
from agent.sources.sim.faults.registry import FAULTS
from controller import record_json
from controller.record_json import Unsupported, from_json, to_json
from controller.record_lines import parse_line, to_json_line
from protos.gpufleet.v1 import operator_pb2, telemetry_pb2
from tests.simfleet import SimFleet

FD = descriptor.FieldDescriptor
T0 = 1_796_000_000.0
DOUBLES = [
    0.0,
    -0.0,
    1.5,
    -2.25,
    1 / 3,
    math.nan,
    math.inf,
    -math.inf,
    3.4e38,
    1e-45,
    1.7e308,
    -1.7e308,
    5e-324,
]
DOUBLES += [123456789.123456789, 1e22, 1e16, 65504.1, 1e-7]
STRINGS = ["", "a", "nœud-1 ☃", "\u2028\u2029", 'quote " and \\ backslash', "\x00\x1f ctl", "é" * 40, "🙂"]
INTS = {
    FD.CPPTYPE_INT32: [0, 1, -1, 2**31 - 1, -(2**31)],
    FD.CPPTYPE_UINT32: [0, 1, 2**32 - 1],
    FD.CPPTYPE_INT64: [0, -1, 2**63 - 1, -(2**63), 2**53 + 1],
    FD.CPPTYPE_UINT64: [0, 1, 2**64 - 1, 2**53 + 1],
}


def _value(field: Any, rng: random.Random, depth: int) -> Any:
    cpp = field.cpp_type
    if cpp in INTS:
        return rng.choice([*INTS[cpp], rng.randrange(0, 100_000)])
    if cpp == FD.CPPTYPE_DOUBLE:
        return rng.choice([*DOUBLES, rng.uniform(-1e12, 1e12)])
    if cpp == FD.CPPTYPE_BOOL:
        return rng.random() < 0.5
    if cpp == FD.CPPTYPE_STRING:
        if field.type == FD.TYPE_BYTES:
            return rng.randbytes(rng.randrange(0, 9))
        return rng.choice(STRINGS)
    if cpp == FD.CPPTYPE_ENUM:
        return rng.choice([v.number for v in field.enum_type.values])
    raise AssertionError(f"no value for {field.full_name}")


def fuzz(message: Message, rng: random.Random, depth: int = 0, fill: float = 0.7) -> Message:
    """Set about `fill` of `message`'s fields (each oneof once) with values from the lists above."""
    for field in message.DESCRIPTOR.fields:
        if rng.random() > fill:
            continue
        if field.containing_oneof is not None and message.WhichOneof(field.containing_oneof.name):
            continue
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            target = getattr(message, field.name)
            value_field = sub.fields_by_name["value"]
            for _ in range(rng.randrange(0, 4)):
                key = rng.choice(STRINGS) if sub.fields_by_name["key"].cpp_type == FD.CPPTYPE_STRING else 1
                if value_field.message_type is not None:
                    fuzz(target[key], rng, depth + 1, fill)
                else:
                    target[key] = _value(value_field, rng, depth)
        elif sub is not None:
            if sub.full_name == "google.protobuf.Timestamp":
                stamps = [getattr(message, field.name)] if not field.is_repeated else []
                for stamp in stamps:
                    stamp.seconds = rng.choice([0, 1_796_000_000, -62135596800, 253402300799])
                    stamp.nanos = rng.choice([0, 1_000_000, 123_456_000, 999_999_999, 1])
                continue
            if depth > 5:
                continue
            if field.is_repeated:
                for _ in range(rng.randrange(0, 3)):
                    fuzz(getattr(message, field.name).add(), rng, depth + 1, fill)
            else:
                fuzz(getattr(message, field.name), rng, depth + 1, fill)
                getattr(message, field.name).SetInParent()  # an empty message is present too
        elif field.is_repeated:
            getattr(message, field.name).extend(_value(field, rng, depth) for _ in range(rng.randrange(0, 4)))
        else:
            setattr(message, field.name, _value(field, rng, depth))
    return message


def _reference_line(msg: Message) -> str:
    return json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=None) + "\n"


def _same(a: Message, b: Message) -> bool:
    return a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)


def _recorded(rng: random.Random, kind: str) -> operator_pb2.RecordedMessage:
    msg = operator_pb2.RecordedMessage(node=rng.choice(STRINGS), dropped_before=rng.choice([0, 3, 2**63 - 1]))
    msg.received.FromNanoseconds(rng.choice([1_796_000_000_123_456_789, 1_796_000_000 * 10**9]))
    fuzz(getattr(msg.message, kind), rng)
    getattr(msg.message, kind).SetInParent()
    return msg


@pytest.mark.parametrize("kind", ["hello", "frame"])
def test_fuzzed_messages_make_json_format_s_lines_and_read_back_as_it_reads_them(kind: str) -> None:
    rng = random.Random(f"record_json {kind}")
    made = read = 0
    for _ in range(150):
        msg = _recorded(rng, kind)
        line = _reference_line(msg)
        assert to_json_line(msg) == line
        reference = json_format.Parse(line, operator_pb2.RecordedMessage())
        assert _same(parse_line(line), reference)
        with contextlib.suppress(Unsupported):
            assert to_json(msg) + "\n" == line
            made += 1
        with contextlib.suppress(Unsupported):
            assert _same(from_json(line, operator_pb2.RecordedMessage), reference)
            read += 1
    assert made >= 100 and read >= 100  # most take the fast paths (a bytes field does not)


def test_a_simulated_fleet_s_messages_all_take_the_fast_path() -> None:
    """What agents send (every fault the simulator has), both ways, never handed to json_format."""
    names = sorted(FAULTS)  # one fault a node, the simulator picking its target
    sim = SimFleet(len(names) + 1, {f"node-{i:02d}": [FaultSpec(f)] for i, f in enumerate(names)}, start=T0)
    messages = []
    for name in sim.sims:
        msg = operator_pb2.RecordedMessage(node=name)
        msg.received.FromSeconds(int(sim.now))
        msg.message.hello.CopyFrom(sim.hello(name))
        messages.append(msg)
    for step in range(4):
        sim.now += 1.0
        for name in sim.sims:
            msg = operator_pb2.RecordedMessage(node=name)
            msg.received.FromNanoseconds(int(sim.now * 1e9) + 17)
            msg.message.frame.CopyFrom(sim.frame(name, probes=step == 0))
            messages.append(msg)
    for msg in messages:
        line = _reference_line(msg)
        assert to_json(msg) + "\n" == line
        assert _same(from_json(line, operator_pb2.RecordedMessage), msg)


def _outcome(text: str) -> tuple[str, str]:
    """(kind, what): the message's deterministic bytes, or the error's type and text."""
    try:
        return "message", parse_line(text).SerializeToString(deterministic=True).hex()
    except json_format.ParseError as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def _reference(text: str) -> tuple[str, str]:
    try:
        return "message", json_format.Parse(text, operator_pb2.RecordedMessage()).SerializeToString(
            deterministic=True
        ).hex()
    except json_format.ParseError as exc:
        return "error", f"{type(exc).__name__}: {exc}"


FRAME = '{"received": "2026-12-03T13:20:50.5Z", "node": "n", "message": {"frame": {%s}}}'
HELLO = '{"received": "2026-12-03T13:20:50Z", "node": "n", "message": {"hello": {%s}}}'
ODD_LINES = [
    FRAME % '"seq": "12"',
    FRAME % '"seq": 12',
    FRAME % '"seq": "+12"',
    FRAME % '"seq": " 12"',
    FRAME % '"seq": 12.0',
    FRAME % '"seq": 12.5',
    FRAME % '"seq": "1e3"',
    FRAME % '"seq": true',
    FRAME % '"seq": "-1"',
    FRAME % '"seq": "18446744073709551616"',
    FRAME % '"seq": null',
    FRAME % '"seq": 1, "seq": 2',
    FRAME % '"boot_id": "a", "bootId": "b"',
    FRAME % '"bootId": "camel"',
    FRAME % '"no_such_field": 1',
    FRAME % '"[some.extension]": 1',
    FRAME % '"gpus": [{"index": 0, "power_watts": NaN}]',
    FRAME % '"gpus": [{"index": 0, "power_watts": Infinity}]',
    FRAME % '"gpus": [{"index": 0, "power_watts": "NaN"}]',
    FRAME % '"gpus": [{"index": 0, "power_watts": "-Infinity"}]',
    FRAME % '"gpus": [{"index": 0, "power_watts": "nan"}]',
    FRAME % '"gpus": [{"index": 0, "power_watts": "1.5"}]',
    FRAME % '"gpus": [{"index": 0, "power_watts": 1e39}]',
    FRAME % '"gpus": [{"index": 0, "power_watts": 1000000000000000000000000000000000000000}]',
    FRAME % '"gpus": [{"index": 0, "power_watts": 7}]',
    FRAME % '"gpus": [{"index": 0, "power_watts": true}]',
    FRAME % '"gpus": [{"index": 4294967296}]',
    FRAME % '"gpus": [null]',
    FRAME % '"gpus": {"index": 0}',
    FRAME % '"gpus": []',
    FRAME % '"gpus": [{}]',
    FRAME % '"time": "2026-12-03T13:20:50+01:00"',
    FRAME % '"time": "not a time"',
    FRAME % '"time": 5',
    FRAME % '"time": {"seconds": 5}',
    FRAME % '"host": {"cpu_governors": {"performance": 32, "powersave": "4"}}',
    FRAME % '"host": {"cpu_governors": {"performance": null}}',
    FRAME % '"host": {"cpu_governors": {"\\ud800": 1}}',
    FRAME % '"host": {"cpu_governors": []}',
    FRAME % '"host": {}',
    FRAME % '"host": null',
    FRAME % '"node": "\\ud800"',
    FRAME % '"node": 5',
    HELLO % '"inventory": {"gpus": [{"uuid": "GPU-1", "index": 0}]}',
    '{"received": "2026-12-03T13:20:50Z", "message": {"frame": {}, "hello": {}}}',
    '{"received": "2026-12-03T13:20:50Z", "message": {"frame": null, "hello": {}}}',
    '{"received": "2026-12-03T13:20:50Z"}',
    "[1, 2]",
    "5",
    '"text"',
    "{",
    "",
    '{"received": "2026-12-03T13:20:50Z", "node": "n"} trailing',
]


@pytest.mark.parametrize("line", ODD_LINES)
def test_odd_lines_read_as_json_format_reads_them(line: str) -> None:
    assert _outcome(line) == _reference(line)


def test_enum_names_numbers_and_unknown_numbers() -> None:
    """An enum reading is written by name; a number without one goes to json_format (which writes the
    number), both ways; a number where a name is read goes to json_format too."""
    field: Any = next(
        f
        for f in telemetry_pb2.GpuSample.DESCRIPTOR.fields
        if f.cpp_type == FD.CPPTYPE_ENUM and not f.is_repeated
    )
    last = field.enum_type.values[-1]
    msg = operator_pb2.RecordedMessage(node="n")
    gpu = msg.message.frame.gpus.add()
    setattr(gpu, field.name, last.number)
    line = _reference_line(msg)
    assert to_json(msg) + "\n" == line and f'"{field.name}": "{last.name}"' in line
    number_line = line.replace(f'"{last.name}"', str(last.number))
    assert _outcome(number_line) == _reference(number_line)
    with pytest.raises(Unsupported):
        from_json(number_line, operator_pb2.RecordedMessage)
    setattr(gpu, field.name, 99)
    with pytest.raises(Unsupported):
        to_json(msg)
    text = to_json_line(msg)
    assert text == _reference_line(msg) and f'"{field.name}": 99' in text
    assert _outcome(text) == _reference(text)


def test_a_bug_in_the_fast_path_falls_back_to_json_format(monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _recorded(random.Random(1), "frame")
    line = _reference_line(msg)

    def broken(*args: object) -> object:
        raise KeyError("a case record_json got wrong")

    monkeypatch.setattr(record_json, "_to_object", broken)
    monkeypatch.setattr(record_json, "_arguments", broken)
    assert to_json_line(msg) == line
    assert _same(parse_line(line), json_format.Parse(line, operator_pb2.RecordedMessage()))


def test_readings_keep_their_sign_their_presence_and_their_non_finite_values() -> None:
    msg = operator_pb2.RecordedMessage(node="n")
    values = (0.1, -0.0, 0.0, 1e-300, math.nan, -math.inf)
    for value in values:
        msg.message.frame.gpus.add().power_watts = value  # optional: a 0.0 is present
    line = to_json(msg)
    assert line + "\n" == _reference_line(msg)
    watts = [g["power_watts"] for g in json.loads(line)["message"]["frame"]["gpus"]]
    assert [str(w) for w in watts] == ["0.1", "-0.0", "0.0", "1e-300", "NaN", "-Infinity"]
    back = from_json(line, operator_pb2.RecordedMessage).message.frame.gpus
    assert [math.copysign(1, g.power_watts) for g in back[:3]] == [1, -1, 1]
    assert math.isnan(back[4].power_watts) and back[5].power_watts == -math.inf
