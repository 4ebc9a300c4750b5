"""Real probes for the agent and for `gpufleet probe`, without importing torch in this process.

For each run, TorchProbes:
1. reads the GPUs (complete readings, fresh process lists) and refuses each that runs foreign
   compute processes or is busier than the policy allows, unless forced or the node is drained;
2. runs the kernels in a worker process (agent/probes/worker.py) on the GPUs left, with
   CUDA_VISIBLE_DEVICES set to their UUIDs so that the worker's cuda:i is the i-th of them;
3. polls the GPUs every 100 ms meanwhile, and gives each result the reading of its window;
4. turns the worker's results into the agent's: NVML's GPU index, `during`, the datasheet ratio,
   the PCIe link the copy ran on, the command id.

GEMM runs on every selected GPU at once (production load does, which exposes power and thermal
limits), memory and PCIe copies one GPU at a time, NCCL across the selected GPUs: each result's
`mode` says which. Nothing here or in the worker changes a GPU setting.

On the "cpu" device there is no NVML: no safety checks, no readings during the run, no peaks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.probes.base import ProbeOutcome
from agent.probes.datasheet import Datasheet
from agent.probes.datasheet import load as load_datasheet
from agent.probes.kernel import REGISTRY, mode_of
from agent.probes.kernels import info, is_node_level, names
from agent.probes.safety import SafetyPolicy, refusals
from agent.probes.sampling import Sampler, during
from agent.probes.suite import SUITE_BUDGET_SECONDS
from agent.probes.worker_client import Timeouts, WorkerError, WorkerRun, kill_all, run_worker
from agent.sources.gpu import GpuSource

Device = Literal["cuda", "cpu"]
# Opens a GPU source for the run's checks (True: every read complete, process lists fresh) or for
# sampling during the run (False: cheap reads). The runner closes what it opens.
OpenSource = Callable[[bool], GpuSource]
DEFAULT_POLICY = SafetyPolicy()
DEFAULT_TIMEOUTS = Timeouts()


@dataclass
class _Targets:
    """The run's GPUs as NVML numbers them; `order` is the worker's device order (cuda:i = order[i])."""

    order: list[int] | None = None  # None: the worker's own numbering (no NVML, no --gpu)
    names: dict[int, str] = field(default_factory=dict)
    uuids: dict[int, str] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)


class TorchProbes:
    """A ProbeRunner over PyTorch kernels run in a worker process (see the module's docstring).

    `budgets` are seconds per GPU per suite; `sizes` overrides a probe's problem size (tests);
    `progress` is called with each result as it arrives (the CLI's progress lines).
    """

    def __init__(
        self,
        device: Device = "cuda",
        *,
        open_source: OpenSource | None = None,
        policy: SafetyPolicy = DEFAULT_POLICY,
        budgets: Mapping[str, float] = SUITE_BUDGET_SECONDS,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        sample_interval: float = 0.1,
        sizes: Mapping[str, int] | None = None,
        python: str = sys.executable,
        datasheet: Datasheet | None = None,
        progress: Callable[[ProbeOutcome], None] | None = None,
    ) -> None:
        if device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', not {device!r}")
        self.device: Device = device
        self.open_source = open_source if device == "cuda" else None
        self.policy = policy
        self.budgets = dict(budgets)
        self.timeouts = timeouts
        self.sample_interval = sample_interval
        self.sizes = dict(sizes or {})
        self.python = python
        self.datasheet = datasheet or load_datasheet()
        self.progress = progress
        self.hello: dict[str, Any] = {}  # the last worker's hello: torch version, devices
        self._variants: dict[str, dict[str, list[str]]] = {}  # GPU model -> probe -> variants
        self._live: set[subprocess.Popen[bytes]] = set()  # workers running now (close kills them)

    def close(self) -> None:
        """Kill the worker of a run in progress; the run returns what arrived, the rest as errors."""
        kill_all(self._live)

    def available(self) -> list[str]:
        return names()

    def run(
        self,
        probes: Sequence[str],
        *,
        force: bool = False,
        gpus: Sequence[int] | None = None,
        suite: str = "short",
        command_id: str = "",
    ) -> list[ProbeOutcome]:
        """Run `probes` (empty: all) on `gpus` (None or empty: all); refusals and failures are outcomes.

        Raises ValueError for unknown probes, GPUs or suites, WorkerError when nothing can run
        (no torch, no CUDA), SourceError when the GPUs cannot be read for the safety check.
        """
        wanted = list(probes) or names()
        unknown = [p for p in wanted if p not in REGISTRY]
        if unknown:
            raise ValueError(f"unknown probe(s) {', '.join(unknown)}; available: {', '.join(names())}")
        if suite not in self.budgets:
            raise ValueError(f"unknown suite {suite!r}; known: {', '.join(self.budgets)}")
        targets = self._targets(list(gpus or []), force)
        node_level = [p for p in wanted if is_node_level(p)]
        if not probes and targets.order is not None and self.device == "cuda" and len(targets.order) < 2:
            wanted = [p for p in wanted if p not in node_level]  # the default suite: NCCL needs 2 GPUs
        too_few: list[ProbeOutcome] = []
        if targets.order is not None and self.device == "cuda" and len(targets.order) == 1:
            # Asked for by name on one GPU: the worker would plan no step for it, so say why here.
            why = f"needs 2 or more GPUs; only GPU {targets.order[0]} may be probed now"
            too_few = [_refused(p, "", None, f"{p} {why}") for p in wanted if p in node_level]
            wanted = [p for p in wanted if p not in node_level]
        outcomes: list[ProbeOutcome] = []
        if wanted and targets.order != []:
            outcomes.extend(self._run_worker(wanted, suite, targets))
        outcomes.extend(too_few)
        outcomes.extend(self._refused(targets, wanted))
        for outcome in outcomes:
            outcome.command_id = command_id
            outcome.simulated = False
        return outcomes

    # Which GPUs

    def _targets(self, gpus: list[int], force: bool) -> _Targets:
        if self.device == "cpu":
            if gpus:
                raise ValueError("the cpu device has no GPUs to select")
            return _Targets()
        if self.open_source is None:
            if not (force or self.policy.drained):
                raise ValueError(
                    "cannot check that the GPUs are idle without NVML: force (or drain the node) to probe"
                )
            if any(g < 0 for g in gpus):
                raise ValueError(f"GPU indices must be >= 0, not {gpus}")
            return _Targets(order=gpus or None)
        source = self.open_source(True)
        try:
            inventory = source.inventory()
            readings = source.read()
        finally:
            source.close()
        known = [g.index for g in inventory.gpus]
        missing = [g for g in gpus if g not in known]
        if missing:
            raise ValueError(f"no GPU {', '.join(map(str, missing))} on this node (it has {known})")
        selected = gpus or known
        refused = refusals(readings, selected, self.policy, own_pids={os.getpid()}, force=force)
        return _Targets(
            order=[g for g in selected if g not in refused],
            names={g.index: g.name for g in inventory.gpus},
            uuids={g.index: g.uuid for g in inventory.gpus},
            refused=refused,
        )

    # The worker

    def _run_worker(self, wanted: list[str], suite: str, targets: _Targets) -> list[ProbeOutcome]:
        env = dict(os.environ)
        if targets.order is not None:
            visible = [targets.uuids.get(g) or str(g) for g in targets.order]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        request = {
            "device": self.device,
            "probes": wanted,
            "suite": suite,
            "budget_seconds": self.budgets[suite],
            "sizes": self.sizes,
        }
        sampler = Sampler(self.open_source(False), self.sample_interval) if self.open_source else None
        finished: set[int] = set()

        def arrived(_: int, outcome: ProbeOutcome) -> None:
            self._finish(outcome, targets, sampler)
            finished.add(id(outcome))
            if self.progress is not None:
                self.progress(outcome)

        try:
            if sampler is not None:
                sampler.start()
            run = run_worker(
                request,
                python=self.python,
                env=env,
                timeouts=self.timeouts,
                on_outcome=arrived,
                on_hello=self._hello,
                live=self._live,
            )
        finally:
            if sampler is not None:
                sampler.stop()
                sampler.source.close()
        self.hello = run.hello
        self._remember_variants(run, targets)
        for _, outcome in run.outcomes:
            if id(outcome) not in finished:  # made up by the client: a timeout, a crash
                self._finish(outcome, targets, sampler)
                if self.progress is not None:
                    self.progress(outcome)
        return [outcome for _, outcome in run.outcomes]

    def _finish(self, outcome: ProbeOutcome, targets: _Targets, sampler: Sampler | None) -> None:
        """Worker numbering -> NVML's; the reading during the run, the datasheet ratio, the link."""
        device = outcome.device
        if device.startswith("cuda:"):
            local = int(device.partition(":")[2])
            gpu = self._gpu_of(local, targets)
            outcome.gpu = gpu
            outcome.device = f"cuda:{gpu}"
            if sampler is not None and not outcome.error:
                window = sampler.window(gpu, outcome.time, outcome.time + outcome.duration_seconds)
                outcome.during = during(window)
                outcome.params["during_samples"] = str(len(window))
            self._compare(outcome, targets.names.get(gpu) or self._worker_name(local))
        elif device == "cuda" and targets.order is not None:
            outcome.params["gpus"] = ",".join(map(str, targets.order))  # nccl's own are the worker's

    def _hello(self, hello: dict[str, Any]) -> None:
        self.hello = hello

    def _gpu_of(self, local: int, targets: _Targets, hello: dict[str, Any] | None = None) -> int:
        """NVML's index of the worker's cuda:`local`: by UUID, else by position in CUDA_VISIBLE_DEVICES."""
        devices = (self.hello if hello is None else hello).get("devices", [])
        uuid = devices[local].get("uuid") if local < len(devices) else None
        by_uuid = [g for g, u in targets.uuids.items() if uuid and u == uuid]
        if by_uuid:
            return by_uuid[0]
        if targets.order is not None and local < len(targets.order):
            return targets.order[local]
        return local

    def _worker_name(self, local: int) -> str:
        devices = self.hello.get("devices", [])
        return str(devices[local].get("name", "")) if local < len(devices) else ""

    def _compare(self, outcome: ProbeOutcome, model: str) -> None:
        if outcome.error:
            return
        if model:
            outcome.params.setdefault("model", model)
        peak = self.datasheet.peak(model, outcome.probe, outcome.variant)
        if outcome.probe == "pcie" and outcome.variant in ("h2d", "d2h"):
            peak = self._link(outcome) or peak
        if peak and outcome.value > 0:
            better_high = info(outcome.probe).higher_is_better
            outcome.peak_ratio = outcome.value / peak if better_high else peak / outcome.value

    def _link(self, outcome: ProbeOutcome) -> float | None:
        """Add the link the copy ran on to `params`; return what the GPU's best link carries (NVML's max)."""
        reading = outcome.during
        if reading is None:
            return None
        gen, width = reading.pcie_link_gen, reading.pcie_link_width
        if gen is not None and width is not None:
            allowed = self.datasheet.link_gbps(gen, width)
            outcome.params.update(link_gen=str(gen), link_width=str(width))
            if allowed:
                outcome.params["link_gbps"] = f"{allowed:.1f}"
                outcome.params["link_ratio"] = f"{outcome.value / allowed:.4f}"
        gen_max, width_max = reading.pcie_link_gen_max, reading.pcie_link_width_max
        if gen_max is not None and width_max is not None:
            outcome.params.update(link_gen_max=str(gen_max), link_width_max=str(width_max))
        return self.datasheet.link_gbps(gen_max, width_max)

    # Refused GPUs

    def _remember_variants(self, run: WorkerRun, targets: _Targets) -> None:
        for local, item in enumerate(run.hello.get("devices", [])):
            gpu = self._gpu_of(local, targets, run.hello)
            model = targets.names.get(gpu) or str(item.get("name", ""))
            self._variants[model] = {k: list(v) for k, v in dict(item.get("variants", {})).items()}

    def _refused(self, targets: _Targets, wanted: list[str]) -> list[ProbeOutcome]:
        """Outcomes for the refused GPUs: per GPU, probe and variant (as that GPU model has them);
        a node-level probe gets one when no GPU was left to run it on."""
        if not targets.refused:
            return []
        unknown = {targets.names.get(g, "") for g in targets.refused} - set(self._variants)
        if unknown:
            self._describe([g for g in targets.refused if targets.names.get(g, "") in unknown], targets)
        out: list[ProbeOutcome] = []
        for gpu, why in sorted(targets.refused.items()):
            variants = self._variants.get(targets.names.get(gpu, ""), {})
            for probe in wanted:
                if not is_node_level(probe):
                    out.extend(_refused(probe, v, gpu, why) for v in variants.get(probe) or [""])
        if targets.order == []:
            first = min(targets.refused)
            variants = self._variants.get(targets.names.get(first, ""), {})
            why = (
                "refused: no GPU of the node may be probed now ("
                + "; ".join(w.removeprefix("refused: ") for _, w in sorted(targets.refused.items()))
                + ")"
            )
            for probe in wanted:
                if is_node_level(probe):
                    out.extend(_refused(probe, v, None, why) for v in variants.get(probe) or [""])
        return out

    def _describe(self, gpus: list[int], targets: _Targets) -> None:
        """Learn the variants of GPU models not yet seen (torch reads properties; no GPU work)."""
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(targets.uuids.get(g) or str(g) for g in gpus)
        try:
            run = run_worker(
                {"device": "cuda", "describe": True},
                python=self.python,
                env=env,
                timeouts=self.timeouts,
                live=self._live,
            )
        except WorkerError:
            return  # the refusals go out with an empty variant rather than not at all
        self._remember_variants(run, _Targets(order=gpus, names=targets.names, uuids=targets.uuids))


def _refused(probe: str, variant: str, gpu: int | None, why: str) -> ProbeOutcome:
    return ProbeOutcome(
        probe=probe,
        variant=variant,
        gpu=gpu,
        value=0.0,
        unit="",
        duration_seconds=0.0,
        time=time.time(),
        error=why,
        mode=mode_of(probe, is_node_level(probe)),
        device="cuda" if gpu is None else f"cuda:{gpu}",
    )
