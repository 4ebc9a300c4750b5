"""The leader election on a Kubernetes Lease (coordination.k8s.io/v1), for controllers in a cluster.

With `kubernetes.leader_lease: NAME`, a controller leads only while it holds the Lease NAME in its
pod's namespace ($GPUFLEET_POD_NAMESPACE): `kubectl get lease NAME` names the leader
(holderIdentity: POD:PID, the hostname being the pod's name) and counts the changes of leader
(leaseTransitions). The store's own lease (controller/store/lease.py) is taken after it, and the
store's term still fences every audited action and command: the Lease decides who leads, the
store guarantees one writer even when two controllers disagree about the Lease for a moment.

The rules are client-go's leader election:
- a Lease with no holder, or none at all, is taken at once;
- another holder's Lease is taken over only once its record has not changed for its own
  leaseDurationSeconds, as this controller's clock measures it (never by comparing renewTime with
  this clock: the two hosts' clocks may differ);
- every write carries the resourceVersion read before it, so of two controllers taking over at once
  one gets 409 Conflict and goes on waiting;
- the holder renews it at every check (the store asks every 2 s) and counts itself deposed when the
  Lease names another holder, or when no renewal succeeded for RENEW_DEADLINE_SECONDS (the API
  server unreachable: it steps down before a standby may take over, LEASE_SECONDS after its last
  renewal);
- a controller that stops releases it (holderIdentity cleared): a standby takes over at its next try.

Blocking calls (the Lease protocol): the store runs them in a thread.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from controller.kube.api import ApiError, KubeApi, Obj

log = logging.getLogger("gpufleet.controller.kube")

LEASE_SECONDS = 15  # leaseDurationSeconds written; client-go's default
RENEW_DEADLINE_SECONDS = 10.0  # a holder that could not renew for this long steps down
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
# Connect and read timeouts of each Lease call: a renewal (a GET and a PUT) that hangs ends well
# within the renew deadline, so a holder cut off from the API server steps down in time.
CALL_TIMEOUT = (2.0, 2.5)


def _without_retries(api: KubeApi) -> KubeApi:
    """The same cluster and credentials, each call tried once: urllib3's default three retries would
    turn a 2.5 s read timeout into 10 s, the whole renew deadline."""
    from kubernetes.client import ApiClient

    configuration = copy.deepcopy(api.client.configuration)
    configuration.retries = False
    return KubeApi(ApiClient(configuration), where=api.where)


def micro_time(unix: float) -> str:
    """A MicroTime as the API server writes it: RFC 3339, microseconds, UTC."""
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubeLease:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        holder: str,
        *,
        duration_seconds: int = LEASE_SECONDS,
        renew_deadline_seconds: float = RENEW_DEADLINE_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if renew_deadline_seconds >= duration_seconds:
            raise ValueError("the renew deadline must be shorter than the lease duration")
        self.api = _without_retries(api)
        self.namespace = namespace
        self.name = name
        self.holder = holder
        self.duration_seconds = duration_seconds
        self.renew_deadline_seconds = renew_deadline_seconds
        self.monotonic = monotonic
        self.wall = wall
        self.description = f"Lease {namespace}/{name}"
        self._held = False
        self._renewed = 0.0  # monotonic time of the last successful write as holder
        self._observed: tuple[Any, ...] | None = None  # another holder's record, as last read
        self._observed_at = 0.0  # when it was first read as it is (monotonic)
        self._last_error = ""

    @property
    def path(self) -> str:
        return f"{LEASES.format(namespace=self.namespace)}/{self.name}"

    # The Lease protocol

    def try_acquire(self) -> bool:
        try:
            current = self._get()
            if current is None:
                return self._create()
            spec = current.get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            if holder and holder != self.holder and not self._expired(current, holder):
                return False
            return self._write(current, taking_over=holder != self.holder)
        except ApiError as exc:
            self._note(f"cannot take {self.description}: {exc}")
            return False

    def alive(self) -> bool:
        """Renew; False once another holds it, or no renewal succeeded for the renew deadline."""
        if not self._held:
            return False
        try:
            current = self._get()
            if current is None or str((current.get("spec") or {}).get("holderIdentity") or "") != self.holder:
                log.error("%s is no longer held by %s: stepping down", self.description, self.holder)
                self._held = False
                return False
            if self._write(current, taking_over=False):
                return True
        except ApiError as exc:
            self._note(f"cannot renew {self.description}: {exc}")
        if self.monotonic() - self._renewed >= self.renew_deadline_seconds:
            log.error(
                "%s not renewed for %.0f s: stepping down", self.description, self.monotonic() - self._renewed
            )
            self._held = False
        return self._held

    def release(self) -> None:
        """Clear the holder, so that a standby takes over at its next try (best effort)."""
        held, self._held = self._held, False
        try:
            if not held:
                return
            current = self._get()
            if current is None or (current.get("spec") or {}).get("holderIdentity") != self.holder:
                return
            spec = dict(current.get("spec") or {})
            spec["holderIdentity"] = ""
            current["spec"] = spec
            self.api.request("PUT", self.path, body=current, timeout=CALL_TIMEOUT)
            log.info("released %s", self.description)
        except ApiError as exc:
            log.warning("cannot release %s (a standby takes over once it expires): %s", self.description, exc)
        finally:
            self.api.close()

    # Reading and writing the Lease

    def _get(self) -> Obj | None:
        try:
            return self.api.request("GET", self.path, timeout=CALL_TIMEOUT)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _create(self) -> bool:
        now = micro_time(self.wall())
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.holder,
                "leaseDurationSeconds": self.duration_seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            created = self.api.request(
                "POST", LEASES.format(namespace=self.namespace), body=body, timeout=CALL_TIMEOUT
            )
        except ApiError as exc:
            if exc.status == 409:  # another controller created it first
                return False
            raise
        self._took(created, taking_over=True)
        return True

    def _write(self, current: Obj, *, taking_over: bool) -> bool:
        """PUT the Lease as held by us (renewed, or taken over); False on a conflict."""
        now = micro_time(self.wall())
        spec = dict(current.get("spec") or {})
        if taking_over:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=self.holder, leaseDurationSeconds=self.duration_seconds, renewTime=now)
        body = {**current, "spec": spec}
        try:
            # The body carries the resourceVersion read: a change since is a 409.
            written = self.api.request("PUT", self.path, body=body, timeout=CALL_TIMEOUT)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        self._took(written, taking_over=taking_over)
        return True

    def _took(self, lease: Obj, *, taking_over: bool) -> None:
        if taking_over or not self._held:
            transitions = (lease.get("spec") or {}).get("leaseTransitions", 0)
            log.info(
                "holding %s as %s (leader changes so far: %s)", self.description, self.holder, transitions
            )
        self._held = True
        self._renewed = self.monotonic()
        self._observed = None
        self._last_error = ""

    def _expired(self, current: Obj, holder: str) -> bool:
        """Whether another holder's record has stood unchanged for its leaseDurationSeconds, by this
        controller's clock since it first read it so."""
        spec = current.get("spec") or {}
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        now = self.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
            return False
        duration = spec.get("leaseDurationSeconds")
        seconds = float(duration) if isinstance(duration, int | float) and duration > 0 else LEASE_SECONDS
        return now - self._observed_at >= seconds

    def _note(self, message: str) -> None:
        if message != self._last_error:  # once per distinct failure, not every 2 s
            log.warning("%s", message)
        self._last_error = message
