"""`gpufleet demo`: a controller and N agent processes on loopback, faults injected, found and scored.

The demo is the one place that wires agent and controller together, and it does so only through
processes and the wire: it starts `python -m controller` and `python -m agent`, and reads results
through the Operator API like any client.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from controller.cli.jsonify import message_to_dict
from controller.cli.layout import show
from controller.cli.tables import findings_table
from controller.demo.agents import Agents
from controller.demo.catalogue import agent_faults, detectable
from controller.demo.kube import DemoCluster, NodeLife
from controller.demo.plan import Injected, node_names, plan_faults
from controller.demo.probe_rounds import ProbeRounds
from controller.demo.processes import Child, spawn, stop_all
from controller.demo.run_clock import RunClock
from controller.demo.score import score
from controller.demo.tuning import drains, fixable, outcome, settled, summary
from controller.demo.view import injected_table, live_panel
from protos.gpufleet.v1 import findings_pb2, operator_pb2, operator_pb2_grpc
from protos.logsafe import configure_logging
from protos.names import cause_name, severity_name

log = logging.getLogger("gpufleet.demo")

# Faster than production so a short demo sees everything: 1 s samples, 1 s detection passes, and
# 5 s to call throttling "held" (production: 10 s, 10 s, 60 s).
DETECT_INTERVAL_SECONDS = 1.0
THROTTLE_WINDOW_SECONDS = 5.0
START_TIMEOUT_SECONDS = 60.0
# The scheduler probes idle GPUs (controller/demo/agents.py: jobs pause 4 s in 12) every 8 s,
# looking every second, up to 30% of the nodes at once (production: 30 min, 10 s, 10%), so
# scheduled rounds show within a minute. A round reaches the demo through GetNode's results.
PROBE_INTERVAL_SECONDS = 8.0
PROBE_CHECK_SECONDS = 1.0
PROBE_FLEET_SHARE = 0.3
ROUNDS_POLL_SECONDS = 2.0
# With tuning and no --seconds: the run ends when every injected fault has its outcome, or here.
TUNING_MAX_SECONDS = 240.0
BREAKER_WINDOW_SECONDS = 4.0


class DemoError(Exception):
    pass


def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _start_controller(tmp: Path, tuning: str, cluster: DemoCluster | None) -> tuple[Child, str]:
    settings: dict[str, Any] = {}
    if tuning != "off":
        settings["tuning"] = {"default_policy": tuning}
        # The breaker's window shrinks with the demo's other clocks (production: 1 h): one node in action
        # at a time still, each holding its place 4 s after it ends.
        settings["breaker"] = {"window_seconds": BREAKER_WINDOW_SECONDS}
    config = _write_yaml(
        tmp / "controller.yaml",
        {
            **settings,
            "listen": "127.0.0.1:0",
            "metrics_address": None,  # a demo binds nothing beyond loopback gRPC
            # The demo's own fake cluster, or none (never the one $KUBECONFIG points at).
            "kubernetes": cluster.controller_config() if cluster else {"enabled": False},
            "db": str(tmp / "gpufleet.db"),
            "stale_after_seconds": 10,
            "detect": {
                "interval_seconds": DETECT_INTERVAL_SECONDS,
                "throttle_window_seconds": THROTTLE_WINDOW_SECONDS,
            },
            "probes": {
                "interval_seconds": PROBE_INTERVAL_SECONDS,
                "check_every_seconds": PROBE_CHECK_SECONDS,
                "max_fleet_share": PROBE_FLEET_SHARE,
            },
        },
    )
    ready = tmp / "controller.ready"
    child = spawn(
        "controller", ["controller", "controller", "--config", str(config), "--ready-file", str(ready)], tmp
    )
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not ready.exists():
        if child.process.poll() is not None or time.monotonic() > deadline:
            raise DemoError(f"the controller did not start:\n{child.log_tail()}")
        time.sleep(0.05)
    return child, str(json.loads(ready.read_text())["address"])


def _poll(
    stub: operator_pb2_grpc.OperatorStub,
) -> tuple[list[operator_pb2.NodeSummary], list[findings_pb2.Finding]]:
    nodes = stub.ListNodes(operator_pb2.ListNodesRequest(), timeout=5).nodes
    findings = stub.ListFindings(operator_pb2.ListFindingsRequest(), timeout=5).findings
    return list(nodes), list(findings)


def _finding_json(f: findings_pb2.Finding) -> dict[str, Any]:
    evidence = message_to_dict(f.evidence)
    evidence["supporting"] = [message_to_dict(e) for e in f.supporting]
    return {
        "node": f.node,
        "gpu": f.gpu if f.HasField("gpu") else None,
        "cause": cause_name(f.cause),
        "severity": severity_name(f.severity),
        "evidence": evidence,
    }


def _validate(args: argparse.Namespace) -> None:
    if args.nodes < 1:
        raise DemoError("--nodes must be >= 1")
    if not 1 <= args.gpus_per_node <= 64:
        raise DemoError("--gpus-per-node must be within 1..64")
    if args.seconds is not None and not 0 < args.seconds < math.inf:
        raise DemoError("--seconds must be a finite number > 0")


def _plan(args: argparse.Namespace) -> int | tuple[list[str], list[str], list[Injected]]:
    """(node names, the fixable fault kinds, the faults to inject), or the exit status after
    saying in one line why not."""
    try:
        _validate(args)
        names = node_names(args.nodes)
        kinds = detectable(agent_faults())
        fixable_faults = fixable(kinds) if args.tuning != "off" else []
    except (DemoError, ValueError) as exc:
        print(f"gpufleet demo: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"gpufleet demo: {exc}", file=sys.stderr)
        return 1
    try:
        injected = plan_faults(names, args.gpus_per_node, args.faults, args.seed, kinds, first=fixable_faults)
    except ValueError as exc:
        print(f"gpufleet demo: {exc}", file=sys.stderr)
        return 2
    return names, fixable_faults, injected


def run_demo(args: argparse.Namespace) -> int:
    configure_logging(logging.INFO)  # node text escaped, repeated lines throttled
    started = time.monotonic()
    if args.seed is None:  # a new fleet each run; the seed is printed, so any run can be repeated
        args.seed = random.SystemRandom().randrange(1_000_000)
    log.info("seed %d (repeat this run with --seed %d)", args.seed, args.seed)
    if args.kubernetes == "fake" and args.tuning == "off":
        args.tuning = "auto"  # drains and retunes both follow the controller's policy
    planned = _plan(args)
    if isinstance(planned, int):
        return planned
    names, fixable_faults, injected = planned
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    children: list[Child] = []
    rounds = ProbeRounds()
    cluster: DemoCluster | None = None
    agents: Agents | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="gpufleet-demo-") as tmpdir:
            tmp = Path(tmpdir)
            try:
                log.info(
                    "starting a controller and %d simulated nodes x %d GPUs", args.nodes, args.gpus_per_node
                )
                for inj in injected:
                    where = "" if inj.gpu is None else f" gpu {inj.gpu}"
                    log.info("injecting %s on %s%s", inj.fault, inj.node, where)
                if args.kubernetes == "fake":
                    cluster = DemoCluster(tmp, names, args.gpus_per_node)
                    log.info("a fake Kubernetes cluster of %d nodes at %s", len(names), cluster.server.url)
                controller, address = _start_controller(tmp, args.tuning, cluster)
                children.append(controller)
                log.info("controller listening on %s (try: gpufleet nodes --controller %s)", address, address)
                agents = Agents(tmp, address, args.gpus_per_node, args.seed, tuning=args.tuning != "off")
                agents.start(names, injected)
                watched = _watch(
                    args,
                    address,
                    injected,
                    started=started,
                    stop=stop,
                    agents=agents,
                    rounds=rounds,
                    fixable_faults=fixable_faults,
                )
            except DemoError as exc:
                print(f"gpufleet demo: {exc}", file=sys.stderr)
                return 1
            finally:
                if agents is not None:
                    children.extend(agents.retired + list(agents.children.values()))
                stop_all([c for c in children if c.name != "controller"])
                stop_all([c for c in children if c.name == "controller"])
                if cluster is not None:
                    cluster.stop()
            failed = [c for c in children if c.process.returncode not in (0, -signal.SIGTERM)]
            for child in failed:
                log.error("%s exited with %s:\n%s", child.name, child.process.returncode, child.log_tail())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return _report(args, injected, watched, rounds, time.monotonic() - started)


def _watch(
    args: argparse.Namespace,
    address: str,
    injected: list[Injected],
    *,
    started: float,
    stop: threading.Event,
    agents: Agents,
    rounds: ProbeRounds,
    fixable_faults: list[str],
) -> Watched:
    interactive = not args.json and sys.stdout.isatty()
    nodes: list[operator_pb2.NodeSummary] = []
    findings: list[findings_pb2.Finding] = []
    watched = Watched()
    if args.kubernetes == "fake":  # the nodes a drain takes out: followed until back in service
        watched.lives = [NodeLife(i.node, i.fault) for i in drains(injected)]
    tuning = args.tuning != "off"
    limit = args.seconds if args.seconds is not None or not tuning else TUNING_MAX_SECONDS
    clock = RunClock(limit, args.nodes, started)
    with grpc.insecure_channel(address) as channel:
        stub = operator_pb2_grpc.OperatorStub(channel)
        live = None
        if interactive:
            from rich.live import Live

            live = Live(refresh_per_second=2, transient=True)
            live.start()
        try:
            last_line = last_rounds = 0.0
            while not stop.is_set():
                now = time.monotonic()
                elapsed = now - started
                if clock.done(now):
                    break
                try:
                    nodes, findings = _poll(stub)
                    clock.saw(now, sum(1 for n in nodes if n.connected))
                    watched.see(findings)
                    if tuning:
                        watched.recommendations = _recommendations(stub)
                    _follow(stub, watched.lives, agents, elapsed)
                except grpc.RpcError as exc:
                    raise DemoError(f"the controller stopped answering: {exc.code().name}") from exc
                if tuning and watched.settled(injected, findings, fixable_faults):
                    log.info("%.0fs: every injected fault has its outcome", elapsed)
                    break
                running = list(agents.children.values())
                if all(a.process.poll() is not None for a in running):
                    raise DemoError("every agent process has exited:\n" + running[0].log_tail())
                if elapsed - last_rounds >= ROUNDS_POLL_SECONDS:
                    last_rounds = elapsed
                    _observe_rounds(stub, nodes, rounds)
                last_line = _show(
                    live,
                    args,
                    (nodes, findings, injected),
                    rounds,
                    ran=clock.ran(now),
                    elapsed=elapsed,
                    last_line=last_line,
                )
                stop.wait(1.0)
            return _last_look(stub, watched, tuning=tuning)
        finally:
            if live is not None:
                live.stop()


@dataclass
class Watched:
    """What the demo saw: the findings at the end, every finding seen during the run (a fixed
    fault's finding resolves before the end), and the tuning recommendations."""

    findings: list[findings_pb2.Finding] = field(default_factory=list)
    seen: dict[tuple[str, int | None, int], findings_pb2.Finding] = field(default_factory=dict)
    recommendations: list[operator_pb2.Recommendation] = field(default_factory=list)
    lives: list[NodeLife] = field(default_factory=list)  # --kubernetes fake: drained nodes' steps

    def settled(
        self, injected: list[Injected], findings: list[findings_pb2.Finding], fixable_faults: list[str]
    ) -> bool:
        """Every injected fault has its outcome, and every drained node is back in service."""
        done = settled(injected, self.recommendations, findings, fixable_faults)
        return done and all(life.done for life in self.lives)

    def see(self, findings: list[findings_pb2.Finding]) -> None:
        for f in findings:
            self.seen[(f.node, f.gpu if f.HasField("gpu") else None, f.cause)] = f


def _last_look(stub: operator_pb2_grpc.OperatorStub, watched: Watched, *, tuning: bool) -> Watched:
    """The findings (and recommendations) as the run ends."""
    watched.findings = _poll(stub)[1]
    watched.see(watched.findings)
    if tuning:
        watched.recommendations = _recommendations(stub)
    return watched


def _show(
    live: Any,
    args: argparse.Namespace,
    seen: tuple[list[operator_pb2.NodeSummary], list[findings_pb2.Finding], list[Injected]],
    rounds: ProbeRounds,
    *,
    ran: float,
    elapsed: float,
    last_line: float,
) -> float:
    """The live panel on a terminal (`ran`: seconds of the fleet streaming), else a progress line
    every 5 s; returns when the last line was written."""
    nodes, findings, injected = seen
    if live is not None:
        live.update(
            live_panel(
                nodes,
                findings,
                injected,
                elapsed=ran,
                seconds=args.seconds,
                expected_nodes=args.nodes,
                rounds=rounds,
                seed=args.seed,
            )
        )
        return last_line
    if elapsed - last_line < 5.0:
        return last_line
    _progress(elapsed, nodes, findings, rounds, args.nodes)
    return elapsed


def _progress(
    elapsed: float,
    nodes: list[operator_pb2.NodeSummary],
    findings: list[findings_pb2.Finding],
    rounds: ProbeRounds,
    expected: int,
) -> None:
    log.info(
        "%.0fs: %d/%d agents connected, %d findings, %d probe rounds (%d scheduled)",
        elapsed,
        sum(1 for n in nodes if n.connected),
        expected,
        len(findings),
        rounds.total,
        rounds.later,
    )


def _follow(
    stub: operator_pb2_grpc.OperatorStub, lives: list[NodeLife], agents: Agents, elapsed: float
) -> None:
    """Note each drained node's Kubernetes steps; repair (restart without its fault) one drained."""
    for life in lives:
        if life.done:
            continue
        try:
            detail = stub.GetNode(operator_pb2.GetNodeRequest(name=life.node), timeout=5)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # its agent has not said hello yet
                continue
            raise
        life.observe(detail.kubernetes, elapsed)
        if life.needs_repair:
            log.info(
                "%.0fs: %s drained: repairing it (its agent restarts without %s)",
                elapsed,
                life.node,
                life.fault,
            )
            agents.repair(life.node)
            life.saw("repaired", elapsed)


def _recommendations(stub: operator_pb2_grpc.OperatorStub) -> list[operator_pb2.Recommendation]:
    request = operator_pb2.ListRecommendationsRequest(limit=1000)
    return list(stub.ListRecommendations(request, timeout=5).recommendations)


def _observe_rounds(
    stub: operator_pb2_grpc.OperatorStub, nodes: list[operator_pb2.NodeSummary], rounds: ProbeRounds
) -> None:
    for node in nodes:
        try:
            rounds.observe(stub.GetNode(operator_pb2.GetNodeRequest(name=node.name), timeout=5))
        except grpc.RpcError as exc:
            raise DemoError(f"the controller stopped answering: {exc.code().name}") from exc


def _report(
    args: argparse.Namespace,
    injected: list[Injected],
    watched: Watched,
    rounds: ProbeRounds,
    elapsed: float,
) -> int:
    tuning = args.tuning != "off"
    # With tuning, a fixed fault's finding is gone by the end: score what was found along the way.
    findings = list(watched.seen.values()) if tuning else watched.findings
    found = [(f.node, f.gpu if f.HasField("gpu") else None) for f in findings]
    recs, final = watched.recommendations, watched.findings
    precision, recall = score(found, [(i.node, i.gpu) for i in injected])
    if args.json:
        body = {
            "nodes": args.nodes,
            "gpus": args.nodes * args.gpus_per_node,
            "seed": args.seed,
            "injected": [
                {"node": i.node, "gpu": i.gpu, "fault": i.fault, "cause": i.cause}
                | ({"outcome": outcome(i, recs, final)} if tuning else {})
                for i in injected
            ],
            "findings": [_finding_json(f) for f in findings],
            "precision": round(precision, 4),
            "recall": round(recall, 4),
            "probe_rounds": rounds.as_dict(),
            "elapsed_s": round(elapsed, 2),
        }
        if tuning:
            body["tuning"] = summary(injected, recs, final)
        if args.kubernetes == "fake":
            body["kubernetes"] = [life.as_dict() for life in watched.lives]
        print(json.dumps(body, sort_keys=False))
        return 0
    from rich.console import Console

    console = Console()
    console.print(f"gpufleet demo: seed {args.seed} (repeat this run with --seed {args.seed})")
    show(injected_table(injected, findings), findings_table(findings))  # fitted: node and fault never cut
    console.print(
        f"{args.nodes} nodes, {args.nodes * args.gpus_per_node} GPUs, {len(injected)} faults injected: "
        f"precision {precision:.2f}, recall {recall:.2f}, {elapsed:.1f}s; "
        f"{rounds.total} probe rounds, {rounds.later} of them scheduled"
    )
    for life in watched.lives:
        console.print(
            f"{life.node} ({life.fault}): "
            + ", ".join(f"{step} at {at:.0f}s" for step, at in life.as_dict()["steps"].items())
        )
    if tuning:
        t = summary(injected, recs, final)
        console.print(
            f"tuning ({args.tuning}): {t['recommended']} recommended, {t['applied']} applied, "
            f"{t['verified']} verified, {t['rolled_back']} rolled back, {t['needs_attention']} need "
            f"attention, {t['drain_recommended']} drains recommended; outcomes "
            + ", ".join(f"{k} {v}" for k, v in sorted(t["outcomes"].items()))
        )
    return 0
