"""A real Prometheus for tests: /usr/bin/prometheus on a free loopback port, scraping given targets
every second, with its TSDB under tmp_path; stopped (terminate, then kill) at teardown.

    def test_x(prometheus_server: PrometheusFactory) -> None:
        prom = prometheus_server({"gpufleet-agent": "127.0.0.1:9400"})
        prom.wait_for('gpufleet_agent_info{node="n1"}', timeout=20)
        prom.query("sum(gpufleet_gpu_power_watts)")
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import free_port, require

__all__ = [
    "PrometheusError",
    "PrometheusFactory",
    "PrometheusServer",
    "prometheus_server",
    "start_prometheus",
]

START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0
SCRAPE_INTERVAL = "1s"


class PrometheusError(Exception):
    """Prometheus refused a query; the message is its own error text (e.g. a parse error)."""


@dataclass(frozen=True, slots=True)
class PrometheusServer:
    url: str  # http://127.0.0.1:PORT
    log: Path  # the server's stdout and stderr

    def query(self, expr: str) -> Any:
        """Evaluate `expr` now (/api/v1/query); the parsed `data.result` (a list for vectors and
        matrices, [time, "value"] for scalars and strings). PrometheusError with its error text."""
        body = urllib.parse.urlencode({"query": expr}).encode()
        request = urllib.request.Request(f"{self.url}/api/v1/query", data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:
            # 400 (bad_data) and 422 (execution) carry a JSON body with Prometheus's own words.
            try:
                text = exc.read().decode(errors="replace")
            finally:
                exc.close()
            try:
                error = json.loads(text)
            except json.JSONDecodeError:
                raise PrometheusError(f"HTTP {exc.code}: {text.strip()}") from None
            raise PrometheusError(f"{error.get('errorType')}: {error.get('error')}") from None
        if answer.get("status") != "success":
            raise PrometheusError(f"{answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]["result"]

    def wait_for(self, expr: str, timeout: float = 20.0) -> Any:
        """Poll `expr` until it returns a non-empty result; that result. TimeoutError naming the
        expression and the last error (a query that cannot parse fails at once)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no data for {expr!r} within {timeout:.0f} s")
            time.sleep(0.25)

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their health and last error (/api/v1/targets)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as response:
            active: list[dict[str, Any]] = json.load(response)["data"]["activeTargets"]
        return active


def _config(targets: Mapping[str, str | Sequence[str]], rule_files: Sequence[Path]) -> dict[str, Any]:
    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": [address] if isinstance(address, str) else list(address)}],
            }
            for job, address in targets.items()
        ],
    }


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise RuntimeError(
        f"prometheus not ready within {START_TIMEOUT_SECONDS:.0f} s:\n{log.read_text()[-4000:]}"
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def start_prometheus(
    directory: Path, targets: Mapping[str, str | Sequence[str]], rule_files: Sequence[Path] = ()
) -> Iterator[PrometheusServer]:
    """Run Prometheus with its config, TSDB and log under `directory`; each key of `targets` is a
    job scraping its HOST:PORT (or several). Ready (/-/ready answered) on entry, stopped on exit."""
    binary = shutil.which("prometheus")
    require(binary is not None, "prometheus missing: apt-get install prometheus")
    assert binary is not None
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "prometheus.yml"
    config.write_text(yaml.safe_dump(_config(targets, rule_files), sort_keys=False))
    address = f"127.0.0.1:{free_port()}"
    log = directory / "prometheus.log"
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address={address}",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        url = f"http://{address}"
        _wait_ready(url, process, log)
        yield PrometheusServer(url, log)
    finally:
        _stop(process)


PrometheusFactory = Callable[..., PrometheusServer]


@pytest.fixture
def prometheus_server(tmp_path: Path) -> Iterator[PrometheusFactory]:
    """Factory: `prometheus_server({"job": "127.0.0.1:PORT"}, rule_files=[...])`; every server it
    starts is stopped at teardown."""
    with contextlib.ExitStack() as stack:
        count = 0

        def start(
            targets: Mapping[str, str | Sequence[str]], rule_files: Sequence[Path] = ()
        ) -> PrometheusServer:
            nonlocal count
            count += 1
            return stack.enter_context(
                start_prometheus(tmp_path / f"prometheus-{count}", targets, rule_files)
            )

        yield start
