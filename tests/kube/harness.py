"""What gpufleet's Kubernetes tests share (objects come from controller/kube/fake/objects.py): a
kubeconfig for a fake API server, a KubeApi on it, a clock that a drain's sleeps move (a drain's
minutes run in milliseconds), the evictions the server received, and a ControllerApp on the fake
cluster with that clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from controller.app import ControllerApp
from controller.config import KubernetesConfig
from controller.kube.api import KubeApi
from controller.kube.cluster import find_cluster
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import pod
from controller.store.audit import AuditEntry
from tests.controller.harness import config, hello

T0 = 1_800_000_000.0
WEB = ("ReplicaSet", "web")
Body = Callable[[ControllerApp], Awaitable[None]]


class FakeTime:
    """A clock (call it) and a sleep (await it) that moves the clock instead of waiting."""

    def __init__(self, now: float = T0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0.001)


def kubeconfig(tmp_path: Path, server: FakeApiServer) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{server.url}"}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: tester}}}}]
users: [{{name: tester, user: {{token: not-checked}}}}]
current-context: fake
"""
    )
    return path


def api_for(tmp_path: Path, server: FakeApiServer) -> KubeApi:
    config = KubernetesConfig(kubeconfig=str(kubeconfig(tmp_path, server)))
    return find_cluster(config, environ={}).require()


def evictions(server: FakeApiServer) -> list[str]:
    """The eviction requests the server received, as namespace/pod, in order."""
    out = []
    for method, path in server.requests:
        parts = path.split("?")[0].split("/")
        if method == "POST" and parts[-1] == "eviction":
            out.append(f"{parts[4]}/{parts[6]}")
    return out


def kube(tmp_path: Path, server: FakeApiServer, **fields: Any) -> KubernetesConfig:
    return KubernetesConfig(kubeconfig=str(kubeconfig(tmp_path, server)), **fields)


async def started(
    cfg: KubernetesConfig, time: FakeTime, db: str = ":memory:", nodes: int = 1
) -> ControllerApp:
    app = ControllerApp(config(db=db, kubernetes=cfg), clock=time)
    app.kube.sleep = time.sleep
    await app.start()
    for i in range(nodes):
        await app.ingest.hello(hello(f"n{i}", gpus=2))
    return app


def run(cfg: KubernetesConfig, body: Body, *, nodes: int = 1) -> None:
    async def main() -> None:
        app = await started(cfg, FakeTime(), nodes=nodes)
        try:
            await body(app)
        finally:
            tasks = list(app.kube.tasks.values())
            app.close()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


async def audit(app: ControllerApp, action: str = "") -> list[AuditEntry]:
    """The audit entries (of one action), by id: the fake clock gives them all the same time."""
    entries = await app.store.list_audit()
    return sorted((e for e in entries if not action or e.action == action), key=lambda e: e.id)


def web_pods(server: FakeApiServer, n: int, on: str = "n0") -> None:
    for i in range(n):
        server.add(pod(f"web-{i}", on, owned_by=WEB, labels={"app": "web"}))
