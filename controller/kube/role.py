"""The controller pod's role label, so that the chart's Service routes to the leader only.

With several replicas on one PostgreSQL store (deploy/helm), one controller leads and the others
wait as standbys. The standbys must be Ready (else `kubectl rollout status`, `helm --wait` and the
replicas-mismatch alert never settle), so readiness cannot be what keeps agents off them: the
Service selects `gpufleet.io/controller-role: leader` as well, and each controller keeps that label
on its own pod (named by $GPUFLEET_POD_NAME and $GPUFLEET_POD_NAMESPACE, the downward API):
`standby` from its start (a container restarted in the pod of a former leader must not stay
routed), `leader` once it leads and listens. A new leader first takes the label from every other
pod that still has it (a leader killed with its pod left in place), then labels its own pod.

Until its pod carries the label its role wants, a controller is not Ready (controller/standing.py),
and it tries again every RETRY_SECONDS; labelled, it checks again every RECHECK_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from controller.kube.api import ApiError, KubeApi
from controller.kube.cluster import Cluster

log = logging.getLogger("gpufleet.controller.kube")

ROLE_LABEL = "gpufleet.io/controller-role"
LEADER = "leader"
STANDBY = "standby"
POD_NAME_ENV = "GPUFLEET_POD_NAME"
POD_NAMESPACE_ENV = "GPUFLEET_POD_NAMESPACE"
RETRY_SECONDS = 2.0
RECHECK_SECONDS = 30.0


class PodRole:
    def __init__(
        self,
        api: KubeApi | None,
        namespace: str,
        name: str,
        *,
        why: str = "",
        retry_seconds: float = RETRY_SECONDS,
        recheck_seconds: float = RECHECK_SECONDS,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.why = why  # without api: why there is none
        self.retry_seconds = retry_seconds
        self.recheck_seconds = recheck_seconds
        self.want: str | None = None
        self.labelled: str | None = None  # the role the pod was last seen to carry
        self.error = ""  # the last failure, for /readyz
        self._changed = asyncio.Event()

    @classmethod
    def from_env(cls, cluster: Cluster, environ: Mapping[str, str]) -> PodRole | None:
        """The pod's role keeper when the pod names itself in the environment; None otherwise."""
        name = environ.get(POD_NAME_ENV, "").strip()
        namespace = environ.get(POD_NAMESPACE_ENV, "").strip()
        if not name or not namespace:
            return None
        return cls(cluster.api, namespace, name, why=cluster.why)

    @property
    def ready(self) -> bool:
        return self.want is not None and self.labelled == self.want

    def set(self, role: str) -> None:
        if role != self.want:
            self.want = role
            self._changed.set()

    async def keep(self, stop: asyncio.Event) -> None:
        """Label the pod with the wanted role until stop is set."""
        while not stop.is_set():
            self._changed.clear()
            want = self.want
            if want is not None:
                await self._label(want)
            wait = self.recheck_seconds if self.ready else self.retry_seconds
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._changed.wait())]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            for task in waits:
                task.cancel()

    async def _label(self, want: str) -> None:
        try:
            await asyncio.to_thread(self.apply, want)
        except ApiError as exc:
            self.labelled = None
            self.error = f"cannot label pod {self.namespace}/{self.name} {ROLE_LABEL}={want}: {exc}"
            log.error("%s", self.error)
            return
        if self.labelled != want:
            log.info("pod %s/%s labelled %s=%s", self.namespace, self.name, ROLE_LABEL, want)
        self.labelled, self.error = want, ""

    def apply(self, role: str) -> None:
        """Label the pod (a leader first takes the label from every other pod); ApiError if not."""
        if self.api is None:
            raise ApiError(0, "", self.why or "no Kubernetes cluster is configured")
        if role == LEADER:
            for pod in self.api.pods_labelled(self.namespace, f"{ROLE_LABEL}={LEADER}"):
                other = str((pod.get("metadata") or {}).get("name") or "")
                if other and other != self.name:
                    self.api.patch_pod(self.namespace, other, _labels(STANDBY))
                    log.warning("took the leader label from pod %s/%s", self.namespace, other)
        pod = self.api.patch_pod(self.namespace, self.name, _labels(role))
        if ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL) != role:
            raise ApiError(0, "", f"the API server did not keep {ROLE_LABEL}={role} on the pod")


def _labels(role: str) -> dict[str, object]:
    return {"metadata": {"labels": {ROLE_LABEL: role}}}
