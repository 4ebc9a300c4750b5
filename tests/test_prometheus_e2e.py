"""End to end with a real Prometheus: a controller and two simulated agents (one with a thermal
fault, so there are findings and throttled GPUs to show) serve /metrics; Prometheus scrapes them
every second; then every PromQL expression of every dashboard under dashboards/ (panels, rows'
panels and template variables), of NVIDIA's dcgm-exporter dashboard (against the agent's
--dcgm-compat names) and of the alert rules is run against it. Dashboard queries must return data;
alert expressions must parse, and the rules, loaded into Prometheus, must evaluate without error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from tests.dashboards.expressions import (
    ALERTS,
    JSON,
    Query,
    alert_rules,
    label_values_check,
    load_dashboards,
    panel_queries,
    substitute,
    variable_query,
    variables,
)
from tests.prometheus_server import PrometheusError, PrometheusFactory, PrometheusServer, start_prometheus
from tests.support import free_port, require

REPO = Path(__file__).resolve().parents[1]
# shared/ sits beside the repository (CI clones main with shared/ next to it).
DCGM_DASHBOARD = REPO.parent / "shared" / "dcgm-exporter" / "dcgm-exporter-dashboard.json"
AGENT_JOB = "gpufleet-agent"  # the alert rules expect the agents' job to contain this
CONTROLLER_JOB = "gpufleet-controller"
START_SECONDS = 25.0  # processes up and every kind of series scraped at least twice
SETTLE_SECONDS = 10.0  # further wait for queries that had no data yet (rate windows filling)
STOP_SECONDS = 10.0

# The fault that gives the dashboards something to show: GPU 0 of n2 overheats, so it throttles
# (hw_thermal_slowdown), its GEMM probe falls behind its peers and the controller raises a finding
# that the probe-outlier detector marks slow.
FAULT = "thermal_throttle:0"
CONTROLLER_CONFIG = "detect:\n  interval_seconds: 1\n  throttle_window_seconds: 2\n"


@dataclass(frozen=True, slots=True)
class Scraped:
    prometheus: PrometheusServer
    logs: Path


def _spawn(stack: ExitStack, args: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )

    def stop() -> None:
        process.terminate()
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    stack.callback(stop)
    return process


def _wait_ready_file(path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not path.exists():
        assert process.poll() is None, f"controller exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"controller not ready:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    require(shutil.which("prometheus") is not None, "prometheus missing: apt-get install prometheus")
    tmp = tmp_path_factory.mktemp("prometheus-e2e")
    grpc, controller_metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    agents = {"n1": f"127.0.0.1:{free_port()}", "n2": f"127.0.0.1:{free_port()}"}
    (tmp / "controller.yaml").write_text(CONTROLLER_CONFIG)
    with ExitStack() as stack:
        logs = {
            name: stack.enter_context((tmp / f"{name}.log").open("wb")) for name in ("controller", *agents)
        }
        ready = tmp / "controller.ready"
        controller = _spawn(
            stack,
            [
                "controller",
                "controller",
                "--listen",
                grpc,
                "--metrics-address",
                controller_metrics,
                "--db",
                str(tmp / "db"),
                "--config",
                str(tmp / "controller.yaml"),
                "--ready-file",
                str(ready),
            ],
            logs["controller"],
        )
        _wait_ready_file(ready, controller, tmp / "controller.log")
        for node, address in agents.items():
            faults = ["--fault", FAULT] if node == "n2" else []
            _spawn(
                stack,
                [
                    "agent",
                    "--sim",
                    "--node",
                    node,
                    "--metrics-address",
                    address,
                    "--dcgm-compat",
                    "--controller",
                    grpc,
                    "--interval",
                    "1",
                    *faults,
                ],
                logs[node],
            )
        prometheus = stack.enter_context(
            start_prometheus(
                tmp / "prometheus",
                {AGENT_JOB: list(agents.values()), CONTROLLER_JOB: controller_metrics},
                rule_files=[ALERTS],
            )
        )
        try:
            for expr in (
                f'count(up{{job=~"{AGENT_JOB}|{CONTROLLER_JOB}"}} == 1) == 3',
                "count(count by (node) (gpufleet_probe_value)) == 2",
                'gpufleet_controller_finding_active{slow="true"}',
                "count(count_over_time(gpufleet_controller_nodes[1m]) > 2)",
            ):
                prometheus.wait_for(expr, timeout=START_SECONDS)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{_state(prometheus, tmp)}") from None
        yield Scraped(prometheus, tmp)


def _state(prometheus: PrometheusServer, logs: Path) -> str:
    """What helps when the fleet never came up: target health and the tail of every log."""
    targets = [(t["labels"].get("instance"), t["health"], t["lastError"]) for t in prometheus.targets()]
    tails = "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(logs.glob("*.log"))
    )
    return f"targets: {targets}\n{tails}\n--- prometheus\n{prometheus.log.read_text()[-1500:]}"


def _dashboard_queries(name: str, dashboard: JSON) -> list[Query]:
    """Every panel query, and each label_values variable as a query for a series with that label."""
    queries = [Query(q.where, substitute(q.expr)) for q in panel_queries(name, dashboard)]
    for variable in variables(dashboard):
        if variable["type"] != "query":
            continue
        check = label_values_check(variable_query(variable))
        assert check is not None, f"{name}: variable {variable['name']} is not label_values(...)"
        queries.append(Query(f"{name}: ${variable['name']} = {variable_query(variable)}", substitute(check)))
    return queries


def _failures(prometheus: PrometheusServer, queries: list[Query]) -> dict[Query, str]:
    """Each query that errs or returns nothing, with why; queries without data are retried for
    SETTLE_SECONDS (rate() needs two points in its window), errors are final at once."""
    failing: dict[Query, str] = {}
    pending = list(queries)
    deadline = time.monotonic() + SETTLE_SECONDS
    while pending:
        empty = []
        for query in pending:
            try:
                result = prometheus.query(query.expr)
            except PrometheusError as exc:
                failing[query] = str(exc)
                continue
            if not result:
                empty.append(query)
        if not empty or time.monotonic() >= deadline:
            failing.update(dict.fromkeys(empty, "no data"))
            break
        pending = empty
        time.sleep(1)
    return failing


def _report(failing: dict[Query, str]) -> str:
    return "\n".join(f"{q.where}: {why}\n    {q.expr}" for q, why in failing.items())


@pytest.mark.slow
def test_every_gpufleet_dashboard_query_returns_data(scraped: Scraped) -> None:
    queries = [q for name, d in load_dashboards().items() for q in _dashboard_queries(name, d)]
    assert len(queries) > 100
    failing = _failures(scraped.prometheus, queries)
    assert not failing, f"{len(failing)} of {len(queries)} dashboard queries failed:\n{_report(failing)}"


@pytest.mark.slow
def test_dcgm_exporter_dashboard_returns_data_from_dcgm_compat(scraped: Scraped) -> None:
    require(DCGM_DASHBOARD.is_file(), f"dcgm-exporter dashboard missing: {DCGM_DASHBOARD}")
    dashboard = json.loads(DCGM_DASHBOARD.read_text())
    queries = _dashboard_queries(DCGM_DASHBOARD.name, dashboard)
    assert len(queries) >= 10
    failing = _failures(scraped.prometheus, queries)
    assert not failing, f"{len(failing)} of {len(queries)} dcgm-exporter queries failed:\n{_report(failing)}"


@pytest.mark.slow
def test_alert_expressions_parse_and_the_rules_evaluate(scraped: Scraped) -> None:
    errors = {}
    for rule in alert_rules():
        try:
            scraped.prometheus.query(rule["expr"])
        except PrometheusError as exc:
            errors[rule["alert"]] = str(exc)
    assert not errors, errors
    # Loaded as rule_files, every rule has been evaluated by now (evaluation_interval 1s).
    with urllib.request.urlopen(f"{scraped.prometheus.url}/api/v1/rules", timeout=10) as response:
        groups: list[dict[str, Any]] = json.load(response)["data"]["groups"]
    health = {
        rule["name"]: (rule["health"], rule.get("lastError", "")) for g in groups for rule in g["rules"]
    }
    assert set(health) == {rule["alert"] for rule in alert_rules()}
    assert all(state == ("ok", "") for state in health.values()), health
    # On real exporter output the rules single out the faulty GPU, and only it (pending: `for`).
    active = {
        (a["metric"]["alertname"], a["metric"].get("node"), a["metric"].get("gpu"))
        for a in scraped.prometheus.query("ALERTS")
    }
    assert active == {("GpufleetGpuThermalThrottling", "n2", "0"), ("GpufleetSlowGpu", "n2", "0")}


def test_the_prometheus_helper_reports_errors_and_waits(prometheus_server: PrometheusFactory) -> None:
    prometheus = prometheus_server({})
    assert prometheus.query("1 + 1")[1] == "2"
    with pytest.raises(PrometheusError, match=r"bad_data: .*parse error"):
        prometheus.query("sum(")
    with pytest.raises(TimeoutError, match="no data for 'absent_metric_gpufleet'"):
        prometheus.wait_for("absent_metric_gpufleet", timeout=0.5)
    assert prometheus.wait_for("vector(1)", timeout=5)[0]["value"][1] == "1"
