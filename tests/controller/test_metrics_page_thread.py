"""The controller's /metrics: the families are read on the event loop (between two of the app's
updates) and the page is written from them on a worker thread, so acks do not wait behind the
writing (controller/metrics_text.py `collected`, protos/scrape_http.py)."""

from __future__ import annotations

import asyncio
import http.client
import threading
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from controller.metrics_http import MetricsServer
from controller.metrics_text import TextGauge


class Recording(TextGauge):
    def __init__(self, threads: dict[str, str], fail: bool) -> None:
        super().__init__("gpufleet_controller_test_nodes", "A test family.", ["node"])
        self.threads, self.fail = threads, fail

    def text(self) -> str:
        self.threads["written"] = threading.current_thread().name
        if self.fail:
            raise ValueError("no page today")
        return super().text()


class Families:
    def __init__(self, fail: bool = False) -> None:
        self.threads: dict[str, str] = {}
        self.fail = fail

    def collect(self) -> Iterator[Metric]:
        self.threads["read"] = threading.current_thread().name
        family = Recording(self.threads, self.fail)
        family.add_metric(["node-a"], 1)
        yield family


def scrape(families: Families) -> tuple[int, bytes, str]:
    """One GET /metrics of a controller MetricsServer on an event loop of its own in a thread:
    (status, body, the loop thread's name)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(families)
    server = MetricsServer(registry)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="the-loop", daemon=True)
    thread.start()
    try:
        address = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1:0"), loop).result(30)
        host, port = address.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("GET", "/metrics")
        answer = connection.getresponse()
        status, body = answer.status, answer.read()
        connection.close()
        return status, body, thread.name
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_families_are_read_on_the_loop_and_the_page_written_on_a_worker() -> None:
    families = Families()
    status, body, loop_thread = scrape(families)
    assert status == 200
    assert b'gpufleet_controller_test_nodes{node="node-a"} 1.0\n' in body
    assert families.threads["read"] == loop_thread
    assert families.threads["written"] not in ("", loop_thread)


def test_a_page_that_cannot_be_written_is_a_500_with_its_reason() -> None:
    families = Families(fail=True)
    status, body, loop_thread = scrape(families)
    assert status == 500
    assert b"no page today" in body
    assert families.threads["written"] != loop_thread
