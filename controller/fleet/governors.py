"""A host's cpufreq governors as its frames report them: how many CPUs run each
(HostSample.cpu_governors), or, from an agent before that field, its summary (its first CPU's
governor) and each CPU's own reading. Read alike by detection (detect/host_tuning.py) and by the
changes a profile would make (remediate/changes.py), so the two never disagree."""

from __future__ import annotations

from collections import Counter

from protos.gpufleet.v1 import telemetry_pb2 as pb


def governor_counts(host: pb.HostSample, *, per_cpu: bool = True) -> dict[str, int]:
    """How many of the host's CPUs run each governor: HostSample.cpu_governors (a name sent empty or
    with no CPUs is none), else (per_cpu) its CPUs' own readings."""
    counts = {name: n for name, n in host.cpu_governors.items() if name and n}
    if counts or not per_cpu:
        return counts
    return dict(Counter(cpu.governor for cpu in host.cpus if cpu.governor))


def governor(host: pb.HostSample) -> str | None:
    """The host's governor: the one most of its CPUs run (a tie: the first by name), else its
    summary (an older agent's: its first CPU's); None when not reported."""
    sent = host.cpu_governors
    if len(sent) == 1:  # every CPU on one governor, as on nearly every host: the map read whole costs 4x
        (name,) = sent
        if name and sent[name]:
            return name
    counts = governor_counts(host, per_cpu=False)
    if not counts:
        if host.HasField("cpu_governor") and host.cpu_governor:
            return host.cpu_governor
        counts = governor_counts(host)
    return min(counts, key=lambda name: (-counts[name], name)) if counts else None


def governors_text(host: pb.HostSample) -> str:
    """The host's governors as an operator reads them: "powersave", or with CPUs on several, each
    with its count, most first ("powersave on 30, performance on 2"); "" when not reported."""
    counts = governor_counts(host)
    if len(counts) > 1:
        ordered = sorted(counts, key=lambda name: (-counts[name], name))
        return ", ".join(f"{name} on {counts[name]}" for name in ordered)
    return governor(host) or ""
