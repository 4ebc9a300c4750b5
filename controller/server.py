"""Controller lifecycle: start the store and gRPC server, run detection and probe scheduling, stop
cleanly on a signal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from controller import event_loop
from controller.app import ControllerApp
from controller.config import ControllerConfig
from controller.db_url import is_postgres_url, redact_url
from controller.errors import NotLeader, StoreUnavailable
from controller.fronts.relay import Fronts
from controller.fronts.wire import FrontSettings
from controller.interceptors import ErrorInterceptor
from controller.listeners import NO_BDP_PROBE, REUSEPORT, Listeners, call_backlog, listen_on
from controller.metrics import controller_registry
from controller.metrics_http import MetricsServer
from controller.operator_api import OperatorServicer
from controller.security.auth import OperatorAuth, operator_auth
from controller.security.tls import ServerTls
from controller.servicer import TelemetryServicer, add_telemetry
from controller.standby_gate import StandbyGate
from controller.standing import Standing
from controller.store.lease import POLL_SECONDS
from protos.gpufleet.v1 import operator_pb2_grpc

log = logging.getLogger("gpufleet.controller")
SERVER_KEEPALIVE_MS = 30_000  # as the agent's own (agent/stream/client.py CHANNEL_OPTIONS)
SERVER_KEEPALIVE_TIMEOUT_MS = 10_000
STANDBY_REFUSAL = "this controller is a standby (replica_ingest): operators are served by the leader"


def server_options(config: ControllerConfig) -> list[tuple[str, int]]:
    return [
        # Oversize messages are refused with RESOURCE_EXHAUSTED by gRPC itself.
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        # Agents ping every 30 s to find dead connections; allow it rather than answer GOAWAY.
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_ping_strikes", 0),
        # The controller pings each connection too, every SERVER_KEEPALIVE_MS, and closes it when no
        # answer comes within SERVER_KEEPALIVE_TIMEOUT_MS (a stopped agent, a dropped link): its
        # streams end and the node shows disconnected. Agents accept pings at any rate.
        ("grpc.keepalive_time_ms", SERVER_KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", SERVER_KEEPALIVE_TIMEOUT_MS),
        # gRPC core (1.5x+) closes on an unanswered ping only after this one (default 60 s).
        ("grpc.http2.ping_timeout_ms", SERVER_KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.max_pings_without_data", 0),  # an idle stream is pinged on, not left unwatched
        NO_BDP_PROBE,
        *call_backlog(config.limits.max_nodes),  # a reconnecting fleet's Hellos wait, not dropped
    ]


async def build_server(
    app: ControllerApp,
    tls: ServerTls | None = None,
    *,
    operator: bool = False,
    auth: OperatorAuth | None = None,
    gate: StandbyGate | None = None,
) -> tuple[Listeners, str]:
    """Started servers bound to app.config.listen (agents and operators; `listeners` of them,
    controller/listeners.py), or with operator=True one to app.config.operator_listen (operators
    only: Telemetry refuses streams there); returns them and the address actually bound.

    With tls.cert in the config the port speaks TLS from `tls` (made from the config when not given:
    TransportError when a file is unusable): `listen` requires client certificates signed by
    tls.client_ca, the operator port none. Without, plaintext (the config allowed it)."""
    # auth: one per controller (both ports share it); made here when not given (TokenFileError when
    # the tokens file is unusable)
    # gate: a standby's (controller/standby_gate.py), whose port serves operators once it leads
    interceptors = [ErrorInterceptor(), auth if auth is not None else operator_auth(app.config)]
    if gate is not None:
        interceptors.append(gate)
    address = app.config.operator_listen if operator else app.config.listen
    assert address is not None, "operator=True needs operator_listen"
    # The agents' port: several servers take new streams in parallel (controller/listeners.py).
    count = 1 if operator else app.config.listeners
    options = server_options(app.config) + ([REUSEPORT] if count > 1 else [])
    if tls is None and app.config.tls.enabled:
        tls = ServerTls(app.config.tls)

    def build() -> grpc.aio.Server:
        server = grpc.aio.server(interceptors=interceptors, options=options)
        add_telemetry(TelemetryServicer(app, agents=not operator), server)
        operator_pb2_grpc.add_OperatorServicer_to_server(OperatorServicer(app), server)
        return server

    def bind(server: grpc.aio.Server, where: str) -> int:
        if tls is None:
            return server.add_insecure_port(where)
        # Credentials of its own: each server's TLS context takes a rotation on its own.
        return server.add_secure_port(where, tls.credentials(client_certificates=not operator))

    return await listen_on(address, count, build, bind)


def write_ready_file(path: str, address: str, operator_address: str | None = None) -> None:
    """Atomically write {"address": ..., "operator_address": ...} (the latter with an operator port)
    so a parent process can find a port chosen by the OS."""
    ready: dict[str, object] = {"address": address, "pid": os.getpid()}
    if operator_address is not None:
        ready["operator_address"] = operator_address
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(ready))
    tmp.replace(path)


@dataclass
class Handover:
    """A standby's agents' port, kept serving when it takes the lead (replica_ingest without ingest
    fronts): its agents' streams stay open, and its operator service opens (StandbyGate)."""

    gate: StandbyGate = field(default_factory=lambda: StandbyGate(STANDBY_REFUSAL))
    auth: OperatorAuth | None = None
    kept: tuple[Listeners, str] | None = None

    async def release(self) -> None:
        """Stop a kept port that no leader will serve on (the start failed after the lead)."""
        kept, self.kept = self.kept, None
        if kept is not None:
            await kept[0].stop(None)


async def _start_grpc(
    app: ControllerApp, tls: ServerTls | None, handover: Handover
) -> list[tuple[Listeners, str]]:
    """The agents' port (a standby's, kept: handover), then the operators' when configured: (server,
    bound address) each. With ingest fronts, the operators' port alone: the fronts serve the agents'
    (_start_fronts)."""
    auth = handover.auth or operator_auth(app.config)
    if app.config.ingest_fronts:
        return [await build_server(app, tls, operator=True, auth=auth)]
    kept, handover.kept = handover.kept, None
    started = [kept if kept is not None else await build_server(app, tls, auth=auth)]
    handover.gate.open()
    if app.config.operator_listen is not None:
        try:
            started.append(await build_server(app, tls, operator=True, auth=auth))
        except OSError:
            await started[0][0].stop(None)
            raise
    return started


async def _stop_grpc(servers: list[tuple[Listeners, str]], grace: float | None) -> None:
    await asyncio.gather(*(server.stop(grace) for server, _ in servers))


async def _listen(
    app: ControllerApp, tls: ServerTls | None, handover: Handover
) -> tuple[list[tuple[Listeners, str]], Fronts | None]:
    """The gRPC servers (_start_grpc) and the ingest fronts when configured; on OSError nothing is
    left listening and the app is closed."""
    try:
        servers = await _start_grpc(app, tls, handover)
    except OSError:
        app.close()
        raise
    if not app.config.ingest_fronts:
        return servers, None
    try:
        return servers, await _start_fronts(app, tls, servers[0][1])
    except OSError:
        await _stop_grpc(servers, None)
        app.close()
        raise


async def _start_fronts(app: ControllerApp, tls: ServerTls | None, operators: str) -> Fronts:
    """ingest_fronts processes on `listen`, relaying every agent stream to this controller (whose
    operators' port, `operators`, they name to operators who call them)."""
    config = app.config
    settings = FrontSettings(
        config.listen,
        server_options(config),
        config.tls if tls is not None else None,
        operators=operators,
    )
    fronts = Fronts(TelemetryServicer(app), config.ingest_fronts, settings)
    await fronts.start()
    app.fronts = fronts
    log.info("%d ingest fronts serve agents on %s", config.ingest_fronts, fronts.address)
    return fronts


def _log_transport(tls: ServerTls | None, address: str, operator_address: str | None) -> None:
    if operator_address is not None:
        log.info(
            "operators on %s (%s)", operator_address, "plaintext" if tls is None else "server TLS, tokens"
        )
    if tls is None:
        log.warning(
            "plaintext gRPC: anyone who can reach %s can speak as any node (give --tls-cert, --tls-key and "
            "--tls-client-ca for mutual TLS)",
            address if operator_address is None else f"{address} or {operator_address}",
        )


def _log_store_sharing(config: ControllerConfig) -> None:
    """Replicas on one SQLite file share its one writer (a lock on the whole file), which runs out
    long before PostgreSQL does (bench/results/2026-11-30_h200host_controller_scale_sqlite_replicas.txt)."""
    if config.replica_ingest and not is_postgres_url(config.db):
        log.warning(
            "replica_ingest on the SQLite file %s: the replicas take turns on its one writer, enough for a "
            "few thousand nodes (at 12,500 nodes, two replicas on 16 cores acked within p99 51 s); "
            "PostgreSQL (--db postgresql://...) for more",
            config.db,
        )


async def serve(
    config: ControllerConfig, *, on_ready: Callable[[str, str | None], None] | None = None
) -> None:
    """Serve until SIGINT/SIGTERM; on_ready(address, operator_address or None) once listening.
    TransportError (before anything starts) when a TLS file is unusable."""
    tls = ServerTls(config.tls) if config.tls.enabled else None
    app = ControllerApp(config)
    standing = Standing(app.cluster, os.environ)  # /readyz and the pod's role label, from now on
    handover = Handover()
    try:
        await standing.begin(config.health_listen)
        standby_work = (lambda: _standby_ingest(app, tls, handover)) if config.replica_ingest else None
        _log_store_sharing(config)
        try:
            await app.start(on_standby=standing.standby, standby_work=standby_work)
        except BaseException:
            await handover.release()
            raise
        await _lead(config, app, tls, standing, on_ready, handover=handover)
    finally:
        await standing.end()


async def _standby_ingest(app: ControllerApp, tls: ServerTls | None, handover: Handover) -> None:
    """replica_ingest: serve agents on `listen` while waiting for the lead (until cancelled), through
    the ingest fronts when configured, as the leader does; operators are refused here until it
    leads (controller/replicas.py). Without fronts the port is kept when the lead is won (handover):
    its agents' streams stay open. A port that cannot be bound leaves this standby idle."""
    server: Listeners | None = None
    fronts: Fronts | None = None
    try:
        if app.config.ingest_fronts:
            fronts = await _start_fronts(app, tls, operators="on the leader: this replica is a standby")
            address, how = fronts.address, f"; {app.config.ingest_fronts} ingest fronts"
        else:
            handover.auth = handover.auth or operator_auth(app.config)
            server, address = await build_server(app, tls, auth=handover.auth, gate=handover.gate)
            how = ""
    except OSError as exc:
        app.fronts = None
        log.error("standby: not ingesting: %s", exc)
        return
    log.info("standby: ingesting the agents that connect to %s (replica_ingest%s)", address, how)
    metrics = await _standby_metrics(app)
    stop = asyncio.Event()
    collecting = asyncio.gather(  # its nodes' state frozen too; its loop watched
        app.collector.run_forever(stop), app.loop_lag.run_forever(stop)
    )
    try:
        if app.replicas is None:
            await asyncio.Event().wait()
        else:  # commands the leader issues for the nodes streaming here
            await app.replicas.deliver_forever()
    finally:
        stop.set()
        await collecting
        if metrics is not None:
            await metrics.stop()  # before the leader's binds the same address
        if fronts is not None:
            await fronts.stop()  # their agents reconnect, to whichever replica their Service picks
            app.fronts = None
        if server is not None and app.takeover.won:  # its agents stream on to the leader
            handover.kept, app.takeover.streams_kept = (server, address), True
        elif server is not None:
            await server.stop(2.0)


async def _standby_metrics(app: ControllerApp) -> MetricsServer | None:
    """A standby's /metrics on metrics_address: its ingest, store and process families, and
    gpufleet_controller_leading 0 (controller/metrics.py); None when not asked for or not bound."""
    config = app.config
    if config.metrics_address is None:
        return None
    metrics = MetricsServer(controller_registry(app, standby=True), web_config=config.metrics_web_config)
    try:
        bound = await metrics.start(config.metrics_address)
    except OSError as exc:
        log.error("standby: no metrics: %s", exc)
        return None
    log.info("standby: metrics on %s://%s/metrics", metrics.scheme, bound)
    return metrics


async def _lead(
    config: ControllerConfig,
    app: ControllerApp,
    tls: ServerTls | None,
    standing: Standing,
    on_ready: Callable[[str, str | None], None] | None,
    *,
    handover: Handover,
) -> None:
    """Serve as the leader until SIGINT/SIGTERM or the lead is lost."""
    metrics: MetricsServer | None = None
    servers, fronts = await _listen(app, tls, handover)
    address = fronts.address if fronts is not None else servers[0][1]
    operator_address = servers[-1][1] if len(servers) > 1 or fronts is not None else None
    if config.metrics_address is not None:
        metrics = MetricsServer(controller_registry(app), web_config=config.metrics_web_config)
        try:
            bound = await metrics.start(config.metrics_address)
            log.info("metrics on %s://%s/metrics", metrics.scheme, bound)
        except OSError:
            await _stop_grpc(servers, None)
            if fronts is not None:
                await fronts.stop()
            app.close()
            raise
    copying = await _before_judging(config, app)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "controller listening on %s (%s; store %s; %s event loop)",
        address,
        "plaintext" if tls is None else "mutual TLS: agents and operators present client certificates",
        redact_url(config.db),
        event_loop.kind(loop),
    )
    _log_transport(tls, address, operator_address)
    probes = config.probes
    periodic = (
        f"every {probes.interval_seconds:.0f}s on idle GPUs, {probes.max_fleet_share:.0%} of nodes at once"
    )
    log.info(
        "probes: on connect %s; periodic %s",
        "yes" if probes.on_connect else "no",
        periodic if probes.periodic else "off",
    )
    standing.leading()
    if on_ready is not None:
        on_ready(address, operator_address)
    detection = asyncio.create_task(app.detect_forever(stop, copying))
    scheduling = asyncio.create_task(app.probing.schedule_forever(stop))
    lost: list[str] = []
    leading = asyncio.create_task(_keep_leading(app, stop, lost))
    # The collector's policy, the loop's lateness, and taking in what the other replicas store
    # (replica_ingest).
    upkeep = [app.collector.run_forever(stop), app.loop_lag.run_forever(stop)] + (
        [] if app.replicas is None else [app.replicas.run_forever(stop)]
    )
    upkept = asyncio.gather(*upkeep)
    await stop.wait()
    await leading
    await upkept
    log.info("controller stopping")
    if metrics is not None:
        await metrics.stop()
    if fronts is not None:
        await fronts.stop()
    await _stop_grpc(servers, 2.0)
    await detection
    await scheduling
    await _close(app, copying)
    if lost:
        raise NotLeader(lost[0])


async def _before_judging(config: ControllerConfig, app: ControllerApp) -> asyncio.Task[None] | None:
    """Before any detector or action judges the fleet (agents and operators are served meanwhile):
    a warm standby's fleet caught up with the store (controller/warm_standby.py). The detection
    process's copy of the fleet is then made in a task of its own (the first pass waits for it,
    ControllerApp.detect_forever) while this controller already leads: at 12,500 nodes the copy
    takes about 40 s on 2 cores, and a standby taking the lead declared itself ready only after it."""
    if app.replicas is not None:
        await app.replicas.catch_up()
    if not config.detect.process:
        return None
    return asyncio.create_task(app.start_detection_process())


async def _close(app: ControllerApp, copying: asyncio.Task[None] | None = None) -> None:
    if copying is not None and not copying.done():  # stopped while the detection copy was going
        copying.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await copying
    try:  # the newest readings not written yet (db_state_seconds); the next frames bring them again
        log.info("stored the latest readings of %d nodes", await app.ingest.flush_state())
    except StoreUnavailable as exc:
        log.error("the latest readings of %d nodes not stored: %s", len(app.ingest.unsaved), exc)
    if app.detection is not None:
        await app.detection.stop()
    app.close()


async def _keep_leading(app: ControllerApp, stop: asyncio.Event, lost: list[str]) -> None:
    """Check the lead every POLL_SECONDS until stop; a lead lost (the lease's session gone, or another
    controller's term in the store) stops this controller at once: it may no longer act."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_SECONDS)
            return
        try:
            leading = await app.store.still_leading()
        except StoreUnavailable as exc:  # the store's own connection: the fence guards every action
            log.warning("could not read the store's leader term: %s", exc)
            continue
        if not leading:
            lost.append(f"lost the lead of the store {app.store.description} (term {app.store.epoch})")
            log.error("%s: stopping; a standby takes over", lost[0])
            stop.set()
