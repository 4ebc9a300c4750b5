"""Which Kubernetes cluster the controller acts on, found once at start.

In order: `kubernetes.kubeconfig` (the controller's --kubeconfig flag), else the in-cluster
service account when the controller runs in a pod ($KUBERNETES_SERVICE_HOST is set), else
$KUBECONFIG. `kubernetes.enabled: false` turns it off. Nothing found (or a kubeconfig that cannot
be used): no cluster; everything else keeps working, and a node action is refused with one line
(FAILED_PRECONDITION) saying why. Nothing here talks to the API server: loading a kubeconfig only
reads files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from controller.config import KubernetesConfig
from controller.errors import FailedPrecondition
from controller.kube.api import KubeApi

log = logging.getLogger("gpufleet.controller.kube")
SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"  # the client's incluster_config.SERVICE_HOST_ENV_NAME
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
NO_CLUSTER = (
    "no Kubernetes cluster is configured (set kubernetes.kubeconfig or --kubeconfig, "
    "run the controller in a pod, or set $KUBECONFIG)"
)
TURNED_OFF = "Kubernetes node actions are turned off (kubernetes.enabled: false)"


@dataclass(slots=True)
class Cluster:
    """The cluster's API (None: no cluster), where it came from, and why there is none."""

    api: KubeApi | None
    source: str = ""  # "kubeconfig FILE", "in-cluster service account", "$KUBECONFIG FILE"
    why: str = ""  # without api: one line for the operator

    def require(self) -> KubeApi:
        """The API, or FailedPrecondition saying that no cluster is configured (and why)."""
        if self.api is None:
            raise FailedPrecondition(self.why or NO_CLUSTER)
        return self.api

    def close(self) -> None:
        if self.api is not None:
            self.api.close()


def _from_kubeconfig(path: str, what: str) -> Cluster:
    # The client (half a second to import) only where a cluster is configured.
    from kubernetes.client import ApiClient, Configuration
    from kubernetes.config import kube_config

    configuration = Configuration()
    try:
        kube_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=configuration, persist_config=False
        )
    except Exception as exc:  # noqa: BLE001 - unreadable file, bad YAML, no current context: all one line
        why = f"no Kubernetes cluster: {what} {path} cannot be used: {exc}"
        log.error("%s", why)
        return Cluster(None, why=why)
    return Cluster(KubeApi(ApiClient(configuration)), source=f"{what} {path}")


def _in_cluster(environ: Mapping[str, str], service_account: Path) -> Cluster:
    from kubernetes.client import ApiClient, Configuration
    from kubernetes.config import incluster_config

    configuration = Configuration()
    loader = incluster_config.InClusterConfigLoader(  # type: ignore[no-untyped-call]
        token_filename=str(service_account / "token"),
        cert_filename=str(service_account / "ca.crt"),
        environ=environ,
    )
    try:
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    except Exception as exc:  # noqa: BLE001 - no token or CA mounted, a bad service address: one line
        why = f"no Kubernetes cluster: the in-cluster service account cannot be used: {exc}"
        log.error("%s", why)
        return Cluster(None, why=why)
    return Cluster(KubeApi(ApiClient(configuration)), source="in-cluster service account")


def find_cluster(
    config: KubernetesConfig,
    environ: Mapping[str, str] | None = None,
    service_account: Path = SERVICE_ACCOUNT,
) -> Cluster:
    """The cluster the config (or the environment) names; never raises."""
    env = os.environ if environ is None else environ
    if not config.enabled:
        return Cluster(None, why=TURNED_OFF)
    if config.kubeconfig:
        found = _from_kubeconfig(config.kubeconfig, "kubeconfig")
    elif env.get(SERVICE_HOST_ENV):
        found = _in_cluster(env, service_account)
    elif env.get("KUBECONFIG"):
        found = _from_kubeconfig(env["KUBECONFIG"], "$KUBECONFIG")
    else:
        found = Cluster(None, why=NO_CLUSTER)
    if found.api is not None:
        log.info("Kubernetes: %s (%s)", found.api.where, found.source)
    return found
