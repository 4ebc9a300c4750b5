"""`gpufleet agent`: run the per-node agent, or take one snapshot with --once."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from typing import Any

from agent import version
from agent.compose.bmc import build_bmc
from agent.compose.metrics import metrics_server
from agent.compose.sources import build_sources
from agent.config import AgentConfig, ConfigError, load
from agent.exporter import MetricsServer, MetricsServerError
from agent.jsonout import finite
from agent.snapshot import Snapshot
from agent.sources.errors import SourceError
from agent.sources.gpu import Inventory
from agent.sources.sim.faults import FaultSpec
from agent.sources.sim.faults.listing import fault_list
from agent.state_lock import StateInUse, StateLock
from protos.gpufleet.v1 import telemetry_pb2
from protos.logsafe import configure_logging
from protos.names import clock_event_reason_names, enum_name

log = logging.getLogger("gpufleet.agent")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufleet agent",
        description="Collect GPU and host telemetry on this node and stream it to the controller.",
    )
    parser.add_argument(
        "--sim", action="store_true", help="use the simulated 8-GPU H100 node instead of NVML"
    )
    parser.add_argument("--node", help="node name (default: config, else the host name)")
    parser.add_argument("--controller", metavar="HOST:PORT", help="controller to stream to (default: none)")
    parser.add_argument(
        "--tls-ca", metavar="FILE", help="PEM CA that signed the controller's certificate (mutual TLS)"
    )
    parser.add_argument(
        "--tls-cert", metavar="FILE", help="PEM certificate of this node (its name as a DNS subjectAltName)"
    )
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext stream to a non-loopback controller: not encrypted, any node can pose as this one",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML config file")
    parser.add_argument("--interval", type=float, metavar="SECONDS", help="sampling interval (default 10)")
    parser.add_argument("--spool-dir", metavar="DIR", help="keep unacked frames here across restarts")
    parser.add_argument(
        "--bmc-url",
        metavar="URL",
        help="read this BMC through Redfish (credentials: bmc section of --config, or the environment)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME[:TARGET]",
        help="with --sim: inject a fault (GPU faults take a GPU index, network ones a port such as "
        "mlx5_1, fan/psu ones a number; see --list-faults); repeatable",
    )
    parser.add_argument(
        "--list-faults",
        action="store_true",
        help="list the faults the simulator can inject (name, level, cause, description) and exit",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=["table", "json"],
        help="with --list-faults: output format (default table)",
    )
    parser.add_argument("--gpus", type=int, metavar="N", help="with --sim: GPUs in the node (default 8)")
    parser.add_argument("--seed", type=int, help="with --sim: random seed (default 0)")
    parser.add_argument("--once", action="store_true", help="take one snapshot, print it and exit")
    parser.add_argument("--json", action="store_true", help="with --once: print JSON")
    parser.add_argument(
        "--metrics-address",
        metavar="HOST:PORT|none",
        help="serve Prometheus /metrics here (default 0.0.0.0:9400; none: no server)",
    )
    parser.add_argument(
        "--metrics-web-config",
        metavar="FILE",
        help="Prometheus web-config file (exporter-toolkit format: TLS, basic auth) for /metrics",
    )
    parser.add_argument(
        "--dcgm-compat",
        action="store_true",
        help="also serve dcgm-exporter's DCGM_FI_* metrics (names, types, labels) on /metrics",
    )
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--version", action="version", version=f"gpufleet agent {version()}")
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.sim:
        out["source"] = "sim"
    if args.node:
        out["node"] = args.node
    if args.interval is not None:
        out["interval_seconds"] = args.interval
    if args.log_level:
        out["log_level"] = args.log_level
    stream: dict[str, Any] = {}
    if args.controller:
        stream["controller"] = args.controller
    if args.spool_dir:
        stream["spool_dir"] = args.spool_dir
    for flag in ("tls_ca", "tls_cert", "tls_key"):
        if getattr(args, flag):
            stream[flag] = getattr(args, flag)
    if args.insecure:
        stream["insecure"] = True
    if stream:
        out["stream"] = stream
    metrics: dict[str, Any] = {}
    if args.metrics_address is not None:
        metrics["address"] = None if args.metrics_address.strip().lower() == "none" else args.metrics_address
    if args.dcgm_compat:
        metrics["dcgm_compat"] = True
    if args.metrics_web_config:
        metrics["web_config"] = args.metrics_web_config
    if metrics:
        out["metrics"] = metrics
    if args.bmc_url:
        out["bmc"] = {"url": args.bmc_url}
    sim: dict[str, Any] = {}
    if args.gpus is not None:
        sim["gpus"] = args.gpus
    if args.seed is not None:
        sim["seed"] = args.seed
    if sim:
        out["sim"] = sim
    return out


def _snapshot_json(agent_inventory: Inventory, snapshot: Snapshot, node: str) -> str:
    """One snapshot as stable JSON: sorted keys, NaN and infinities as null, enum values also named.

    Each GPU reading carries `clock_event_reason_names` (the bitmask decoded) and `compute_mode_name`
    / `fabric_state_name` beside the numbers, spelled as protos.names spells them everywhere else.
    """
    readings = []
    for reading in snapshot.gpus:
        item = dataclasses.asdict(reading)
        reasons = reading.clock_event_reasons
        item["clock_event_reason_names"] = None if reasons is None else clock_event_reason_names(reasons)
        item["compute_mode_name"] = _enum_name(telemetry_pb2.ComputeMode, reading.compute_mode)
        item["fabric_state_name"] = _enum_name(telemetry_pb2.FabricState, reading.fabric_state)
        readings.append(item)
    body = {
        "node": node,
        "inventory": dataclasses.asdict(agent_inventory),
        "snapshot": {**dataclasses.asdict(snapshot), "gpus": readings},
    }
    return json.dumps(finite(body), indent=2, sort_keys=True, allow_nan=False, default=str)


def _enum_name(enum: Any, value: int | None) -> str | None:
    """The enum value's name; None when not read; "unknown_N" for a value the contract lacks."""
    if value is None:
        return None
    try:
        return enum_name(enum, value)
    except ValueError:
        return f"unknown_{value}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_faults:
        print(fault_list(args.output or "table"))
        return 0
    if args.output:
        print("gpufleet agent: -o goes with --list-faults (a snapshot is --once --json)", file=sys.stderr)
        return 2
    try:
        overrides = _overrides(args)
        config = load(args.config, overrides)
        if args.fault and config.source != "sim":
            raise ConfigError("--fault needs --sim: faults are injected into the simulator only")
        if args.fault:
            config.sim.faults.extend(_parse_faults(args.fault, config.sim.gpus))
    except ConfigError as exc:
        print(f"gpufleet agent: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)  # node text escaped, repeated lines rate-limited (protos/logsafe.py)
    state = StateLock()
    try:
        if not args.once:  # a snapshot keeps no state
            for directory, what in _state_dirs(config):
                state.take(directory, what)
    except StateInUse as exc:
        state.close()
        print(f"gpufleet agent: {exc}", file=sys.stderr)
        return 2
    try:
        return _run(args, config)
    finally:
        state.close()


def _state_dirs(config: AgentConfig) -> list[tuple[str, str]]:
    """The directories a running agent keeps state in, each once: the spool (frames, the commands'
    memory, the tuning journal by default) and tuning.state_dir when it is elsewhere."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    spool = config.stream.spool_dir
    for directory, what in ((spool, "spool directory"), (config.tuning.state_dir, "tuning.state_dir")):
        if directory and os.path.realpath(directory) not in seen:
            seen.add(os.path.realpath(directory))
            found.append((directory, what))
    return found


def _run(args: argparse.Namespace, config: AgentConfig) -> int:
    try:
        gpu, host, probes = build_sources(config)
    except (SourceError, ValueError) as exc:
        print(f"gpufleet agent: {exc}", file=sys.stderr)
        return 1
    try:
        bmc = build_bmc(config, gpu)
    except SourceError as exc:  # the BMC's credentials: a config problem, said before anything runs
        gpu.close()
        print(f"gpufleet agent: {exc}", file=sys.stderr)
        return 2
    from agent.compose.tuning import build_tuner
    from agent.daemon import Agent

    tuner = None if args.once else build_tuner(config, gpu, host, bmc)
    agent = Agent(config, gpu, host, probes, bmc=bmc, tuner=tuner)
    if args.once:
        if agent.bmc is not None:
            agent.bmc.poll_once()  # in this thread: one snapshot should show the BMC too
        _await_gpm(gpu)
        snapshot = agent.sample()
        agent.close()
        if args.json:
            print(_snapshot_json(agent.inventory, snapshot, config.node))
        else:
            for reading in snapshot.gpus:
                print(
                    f"gpu {reading.index} {reading.uuid}: {(reading.sm_clock_hz or 0) / 1e6:.0f} MHz "
                    f"{reading.power_watts or 0:.0f} W {reading.temperature_celsius or 0:.0f} C"
                )
        return 0 if all(s.success for s in snapshot.collectors.values()) else 1
    try:
        server = metrics_server(agent, config)
    except MetricsServerError as exc:  # before sampling: the agent never half-starts
        agent.close()
        print(f"gpufleet agent: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(agent, server))


def _await_gpm(gpu: object) -> None:
    """A snapshot's GPM metrics cover a full window from the inventory's sample (NVML only; at most
    agent/sources/nvml/gpm.py's MIN_WINDOW_S), rather than none."""
    ready_in = getattr(gpu, "gpm_ready_in", None)
    if ready_in is not None:
        time.sleep(ready_in())


def _parse_faults(specs: list[str], gpus: int) -> list[Any]:
    from agent.config import FaultConfig

    out = []
    for text in specs:
        try:
            spec = FaultSpec.parse(text)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if spec.gpu is not None and spec.gpu >= gpus:
            raise ConfigError(f"--fault {text}: gpu out of range (node has {gpus})")
        target = None if spec.level == "gpu" or spec.target is None else str(spec.target)
        out.append(FaultConfig(fault=spec.fault, gpu=spec.gpu, target=target))
    return out


async def _serve(agent: Any, server: MetricsServer | None = None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if server is not None:
        server.start()
        compat = " with dcgm-exporter's metrics" if agent.exporter.dcgm_compat else ""
        log.info("serving metrics on %s%s", server.url, compat)
    try:
        await agent.run(stop)
    finally:
        if server is not None:
            server.stop()
    log.info("agent stopped")
    return 0
