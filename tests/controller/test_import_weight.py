"""The controller imports the Kubernetes client and psycopg only where it uses them: each costs a
controller, a front or a CLI command half a second or more to start (controller/kube/cluster.py,
controller/store/backends.py)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("kubernetes", "psycopg")


def loaded_after(statement: str) -> list[str]:
    code = f"import sys\n{statement}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.split()


def test_a_controller_on_sqlite_without_a_cluster_loads_neither() -> None:
    statement = (
        "import controller.server, controller.main, controller.fronts.front, controller.detection.worker\n"
        "from controller.config import KubernetesConfig\n"
        "from controller.kube.cluster import find_cluster\n"
        "from controller.store.backends import open_backend\n"
        "find_cluster(KubernetesConfig(), environ={})\n"
        "open_backend(':memory:')"
    )
    assert loaded_after(statement) == []


def test_a_postgresql_url_or_a_kubeconfig_loads_its_client() -> None:
    statement = (
        "from controller.config import KubernetesConfig\n"
        "from controller.kube.cluster import find_cluster\n"
        "find_cluster(KubernetesConfig(kubeconfig='/nonexistent/kubeconfig'), environ={})\n"
        "import controller.store.postgres"
    )
    assert loaded_after(statement) == list(HEAVY)
