"""Cordon and uncordon against the fake API server: gpufleet's cordon recorded in its annotation,
someone else's cordon never undone (unless forced), a 409 answered by reading the node again, and
maintenance marks found."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.config import MaintenanceConfig
from controller.errors import FailedPrecondition
from controller.kube import nodes
from controller.kube.api import ApiError, KubeApi
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import node
from tests.kube.harness import api_for

NODE_PATH = r"^/api/v1/nodes/n1$"


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        s.add(node("n1"))
        yield s


@pytest.fixture
def api(tmp_path: Path, server: FakeApiServer) -> KubeApi:
    return api_for(tmp_path, server)


def node_annotations(server: FakeApiServer) -> dict[str, str]:
    found = server.get("Node", "n1")
    assert found is not None
    return dict(found["metadata"].get("annotations") or {})


def schedulable(server: FakeApiServer) -> bool:
    found = server.get("Node", "n1")
    assert found is not None
    return not found["spec"].get("unschedulable")


def test_cordon_records_gpufleet_and_uncordon_clears_it(server: FakeApiServer, api: KubeApi) -> None:
    done = nodes.cordon(api, "n1")
    assert done == nodes.Changed(True, "node n1 cordoned by gpufleet")
    assert not schedulable(server) and node_annotations(server)[nodes.CORDONED_BY] == "gpufleet"
    assert nodes.cordon(api, "n1") == nodes.Changed(False, "node n1 was already cordoned by gpufleet")

    done = nodes.uncordon(api, "n1")
    assert done.changed and "gpufleet's cordon" in done.detail
    assert schedulable(server) and nodes.CORDONED_BY not in node_annotations(server)
    assert nodes.uncordon(api, "n1") == nodes.Changed(False, "node n1 was not cordoned")


def test_someone_elses_cordon_is_never_undone_unless_forced(server: FakeApiServer, api: KubeApi) -> None:
    api.patch_node("n1", {"spec": {"unschedulable": True}})  # an operator's kubectl cordon
    done = nodes.cordon(api, "n1")
    assert not done.changed and "someone else" in done.detail
    assert nodes.CORDONED_BY not in node_annotations(server)  # gpufleet did not claim it

    with pytest.raises(FailedPrecondition, match="cordoned by someone else") as err:
        nodes.uncordon(api, "n1")
    assert "--force" in str(err.value)
    assert not schedulable(server)

    done = nodes.uncordon(api, "n1", force=True)
    assert done.changed and "someone else's (forced)" in done.detail and schedulable(server)


def test_a_conflict_reads_the_node_again_and_patches_again(server: FakeApiServer, api: KubeApi) -> None:
    server.fail[("PATCH", NODE_PATH)] = (409, 1)
    start = len(server.requests)
    assert nodes.cordon(api, "n1").changed
    calls = [(m, p.split("?")[0]) for m, p in server.requests[start:]]
    assert calls == [("GET", "/api/v1/nodes/n1"), ("PATCH", "/api/v1/nodes/n1")] * 2
    assert not schedulable(server)


def test_a_stale_resource_version_is_a_real_409_and_is_retried(server: FakeApiServer, api: KubeApi) -> None:
    """The patch carries the resourceVersion it was computed from: a node changed in between
    answers 409 (the fake's own check), and the cordon is computed again on the fresh node."""
    stale = api.get_node("n1")
    api.patch_node("n1", {"metadata": {"labels": {"team": "ml"}}})  # someone else's change
    patch = {
        "metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]},
        "spec": {"unschedulable": True},
    }
    with pytest.raises(ApiError) as err:
        api.patch_node("n1", patch)
    assert err.value.status == 409
    assert nodes.cordon(api, "n1").changed


def test_conflicts_that_never_end_give_up_with_one_line(server: FakeApiServer, api: KubeApi) -> None:
    server.fail[("PATCH", NODE_PATH)] = (409, 100)
    with pytest.raises(ApiError, match="kept changing: 5 conflicting updates") as err:
        nodes.cordon(api, "n1")
    assert err.value.status == 409 and schedulable(server)


def test_other_api_errors_are_not_retried(server: FakeApiServer, api: KubeApi) -> None:
    server.fail[("PATCH", NODE_PATH)] = (500, 1)
    with pytest.raises(ApiError) as err:
        nodes.cordon(api, "n1")
    assert err.value.status == 500 and "injected failure" in str(err.value)


def test_maintenance_marks() -> None:
    config = MaintenanceConfig(annotations=["example.com/maintenance"], labels=["maintenance=true"])
    plain = node("n1")
    assert nodes.maintenance_mark(plain, config) == ""
    annotated = node("n1")
    annotated["metadata"]["annotations"] = {"example.com/maintenance": "ticket-42"}
    assert nodes.maintenance_mark(annotated, config) == "annotation example.com/maintenance=ticket-42"
    labelled = node("n1", labels={"maintenance": "true"})
    assert nodes.maintenance_mark(labelled, config) == "label maintenance=true"
    other_value = node("n1", labels={"maintenance": "false"})
    assert nodes.maintenance_mark(other_value, config) == ""


def test_an_unknown_node_is_a_404(api: KubeApi) -> None:
    with pytest.raises(ApiError) as err:
        nodes.cordon(api, "nope")
    assert err.value.status == 404
