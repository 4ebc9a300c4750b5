"""Controller lifecycle: start the store and gRPC server, run detection and probe scheduling, stop
cleanly on a signal."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

import grpc

from controller.app import ControllerApp
from controller.config import ControllerConfig
from controller.interceptors import ErrorInterceptor
from controller.metrics import controller_registry
from controller.metrics_http import MetricsServer
from controller.operator_api import OperatorServicer
from controller.servicer import TelemetryServicer
from protos.gpufleet.v1 import operator_pb2_grpc, telemetry_pb2_grpc

log = logging.getLogger("gpufleet.controller")


def server_options(config: ControllerConfig) -> list[tuple[str, int]]:
    return [
        # Oversize messages are refused with RESOURCE_EXHAUSTED by gRPC itself.
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        # Agents ping every 30 s to find dead connections; allow it rather than answer GOAWAY.
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_ping_strikes", 0),
    ]


async def build_server(app: ControllerApp) -> tuple[grpc.aio.Server, str]:
    """A started server bound to app.config.listen; returns it and the address actually bound."""
    server = grpc.aio.server(interceptors=[ErrorInterceptor()], options=server_options(app.config))
    telemetry_pb2_grpc.add_TelemetryServicer_to_server(TelemetryServicer(app), server)
    operator_pb2_grpc.add_OperatorServicer_to_server(OperatorServicer(app), server)
    host = app.config.listen.rpartition(":")[0]
    try:
        port = server.add_insecure_port(app.config.listen)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {app.config.listen}: {exc}") from exc
    if port == 0:
        raise OSError(f"cannot listen on {app.config.listen}")
    await server.start()
    return server, f"{host}:{port}"


def write_ready_file(path: str, address: str) -> None:
    """Atomically write {"address": ...} so a parent process can find a port chosen by the OS."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({"address": address, "pid": os.getpid()}))
    tmp.replace(path)


async def serve(config: ControllerConfig, *, on_ready: Callable[[str], None] | None = None) -> None:
    app = ControllerApp(config)
    await app.start()
    metrics: MetricsServer | None = None
    try:
        server, address = await build_server(app)
    except OSError:
        app.close()
        raise
    if config.metrics_address is not None:
        metrics = MetricsServer(controller_registry(app))
        try:
            log.info("metrics on http://%s/metrics", await metrics.start(config.metrics_address))
        except OSError:
            await server.stop(None)
            app.close()
            raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("controller listening on %s (store %s)", address, config.db)
    probes = config.probes
    periodic = (
        f"every {probes.interval_seconds:.0f}s on idle GPUs, {probes.max_fleet_share:.0%} of nodes at once"
    )
    log.info(
        "probes: on connect %s; periodic %s",
        "yes" if probes.on_connect else "no",
        periodic if probes.periodic else "off",
    )
    if on_ready is not None:
        on_ready(address)
    detection = asyncio.create_task(app.detect_forever(stop))
    scheduling = asyncio.create_task(app.probing.schedule_forever(stop))
    await stop.wait()
    log.info("controller stopping")
    if metrics is not None:
        await metrics.stop()
    await server.stop(grace=2.0)
    await detection
    await scheduling
    app.close()
