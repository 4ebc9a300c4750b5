"""The few Kubernetes API calls gpufleet makes, through the official client's ApiClient (its
transport, TLS and credentials), answering plain JSON dicts as the API server sends them.

Synchronous (urllib3): the controller calls these in a worker thread (asyncio.to_thread). A
non-2xx answer raises ApiError with the HTTP status and the server's Status message.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:  # the client is imported where a cluster is configured (kube/cluster.py)
    from kubernetes.client import ApiClient

Obj = dict[str, Any]
TIMEOUT = (5.0, 30.0)  # connect, read (seconds) for every call
PAGE = 500  # pods listed per page
STRATEGIC = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """The API server answered an error (or could not be reached: status 0)."""

    def __init__(self, status: int, reason: str, message: str, body: Obj | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}


def _name(text: str) -> str:
    return quote(text, safe="")


class KubeApi:
    def __init__(self, client: ApiClient, *, where: str = "") -> None:
        self.client = client
        self.where = where or str(client.configuration.host)  # for messages: the server's URL

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        timeout: tuple[float, float] = TIMEOUT,
    ) -> Obj:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = STRATEGIC if method == "PATCH" else "application/json"
        method, url, headers, payload, _ = self.client.param_serialize(
            method, path, query_params=query, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            response = self.client.call_api(method, url, headers, payload, _request_timeout=timeout)
            data = response.read()  # type: ignore[no-untyped-call]
        except Exception as exc:  # connection refused, TLS, timeouts: urllib3's and the client's errors
            raise ApiError(0, "", f"cannot reach the Kubernetes API at {self.where}: {exc}") from exc
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            decoded = {}
        if not 200 <= response.status <= 299:
            obj = decoded if isinstance(decoded, dict) else {}
            message = str(obj.get("message") or (data or b"").decode("utf-8", "replace")[:200])
            raise ApiError(int(response.status), str(response.reason or ""), message, obj)
        return decoded if isinstance(decoded, dict) else {}

    # Nodes

    def get_node(self, name: str) -> Obj:
        return self.request("GET", f"/api/v1/nodes/{_name(name)}")

    def patch_node(self, name: str, patch: Obj) -> Obj:
        return self.request("PATCH", f"/api/v1/nodes/{_name(name)}", body=patch)

    def patch_node_status(self, name: str, patch: Obj) -> Obj:
        return self.request("PATCH", f"/api/v1/nodes/{_name(name)}/status", body=patch)

    # Pods

    def pods_on(self, node: str) -> list[Obj]:
        """Every pod bound to `node`, all namespaces (paged, as kubectl lists them)."""
        pods: list[Obj] = []
        token = ""
        while True:
            query = [("fieldSelector", f"spec.nodeName={node}"), ("limit", str(PAGE))]
            if token:
                query.append(("continue", token))
            page = self.request("GET", "/api/v1/pods", query=query)
            pods += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return pods

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        try:
            return self.request("GET", f"/api/v1/namespaces/{_name(namespace)}/pods/{_name(name)}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def pods_labelled(self, namespace: str, selector: str) -> list[Obj]:
        """The pods of one namespace that a label selector picks (one page: a handful are expected)."""
        page = self.request(
            "GET", f"/api/v1/namespaces/{_name(namespace)}/pods", query=[("labelSelector", selector)]
        )
        return list(page.get("items") or [])

    def patch_pod(self, namespace: str, name: str, patch: Obj) -> Obj:
        return self.request("PATCH", f"/api/v1/namespaces/{_name(namespace)}/pods/{_name(name)}", body=patch)

    def evict(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        """POST a policy/v1 Eviction; ApiError 429 when a PodDisruptionBudget forbids it now."""
        body: Obj = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if grace_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_seconds}
        path = f"/api/v1/namespaces/{_name(namespace)}/pods/{_name(name)}/eviction"
        self.request("POST", path, body=body)

    # What a drain asks about a pod's owners and budgets

    def daemonset(self, namespace: str, name: str) -> Obj | None:
        try:
            return self.request(
                "GET", f"/apis/apps/v1/namespaces/{_name(namespace)}/daemonsets/{_name(name)}"
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def has_daemonset(self, namespace: str, name: str) -> bool:
        return self.daemonset(namespace, name) is not None

    def pdbs(self, namespace: str) -> list[Obj]:
        page = self.request("GET", f"/apis/policy/v1/namespaces/{_name(namespace)}/poddisruptionbudgets")
        return list(page.get("items") or [])
