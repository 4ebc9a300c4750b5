"""The command kinds the controller knows: one per `Command` oneof member, with what it may do.

`mutating`: the command changes the node's settings (tuning, drain). At most one mutating command
is in flight per node. RunProbes is not mutating (probing keeps its own one-run-per-node rule).
ApplyProfile is, dry runs included (the agent plans against the node's live settings; a plan
beside a running apply would read a half-applied node).
"""

from __future__ import annotations

from dataclasses import dataclass

from protos.gpufleet.v1 import telemetry_pb2 as pb


@dataclass(frozen=True, slots=True)
class CommandKind:
    name: str  # the Command oneof member
    mutating: bool
    timeout_seconds: float  # the default deadline, from when it is issued


KINDS: dict[str, CommandKind] = {
    k.name: k
    for k in (
        CommandKind("run_probes", mutating=False, timeout_seconds=900.0),
        # apply, read back, re-probe the affected GPUs (short suite), commit or roll back
        CommandKind("apply_profile", mutating=True, timeout_seconds=600.0),
    )
}


def kind_of(command: pb.Command) -> str:
    return command.WhichOneof("action") or ""
