"""The simulator's probe runner honours the same request as the real one."""

from __future__ import annotations

import pytest

from agent.sources.sim import SimNode
from agent.sources.sim.probes import ModelledProbes


def runner(gpus: int = 4) -> ModelledProbes:
    return ModelledProbes(SimNode("sim-node", gpus=gpus))


def test_only_the_gpus_asked_for_and_nccl_across_them() -> None:
    outcomes = runner().run([], gpus=[1, 3], command_id="c9", suite="full")
    per_gpu = {(o.probe, o.gpu) for o in outcomes if o.gpu is not None}
    assert {gpu for _, gpu in per_gpu} == {1, 3}
    (nccl,) = [o for o in outcomes if o.probe == "nccl"]
    assert (nccl.gpu, nccl.params["ranks"], nccl.params["gpus"], nccl.device) == (None, "2", "1,3", "cuda")
    assert all(o.command_id == "c9" and o.simulated and o.error == "" for o in outcomes)
    modes = {o.probe: o.mode for o in outcomes}
    assert modes == {"gemm": "concurrent", "membw": "isolated", "pcie": "isolated", "nccl": "concurrent"}
    assert {o.device for o in outcomes if o.probe == "gemm"} == {"cuda:1", "cuda:3"}


def test_every_gpu_by_default() -> None:
    outcomes = runner().run(["membw", "nccl"])
    assert [o.gpu for o in outcomes if o.probe == "membw"] == [0, 1, 2, 3]
    (nccl,) = [o for o in outcomes if o.probe == "nccl"]
    assert nccl.params["ranks"] == "4" and "gpus" not in nccl.params


def test_one_gpu_leaves_nccl_out_of_the_default_suite_and_fails_it_when_asked() -> None:
    assert "nccl" not in {o.probe for o in runner().run([], gpus=[2])}
    assert "nccl" not in {o.probe for o in runner(gpus=1).run([])}
    (nccl,) = runner().run(["nccl"], gpus=[2])
    assert nccl.error == "nccl needs 2 or more GPUs; 1 selected"


def test_a_slower_link_in_the_subset_shows_in_nccl() -> None:
    node = SimNode("sim-node", gpus=4)
    whole = ModelledProbes(node).run(["nccl"])[0].value
    node.gpus[3].condition.nvlinks_down = {0, 1, 2, 3, 4, 5, 6, 7, 8}  # half its 18 links
    assert ModelledProbes(node).run(["nccl"], gpus=[0, 1])[0].value == pytest.approx(whole, rel=0.05)
    assert ModelledProbes(node).run(["nccl"], gpus=[0, 3])[0].value < 0.6 * whole


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"gpus": [4]}, "no GPU 4"), ({"suite": "long"}, "unknown suite"), ({"probes": ["x"]}, "unknown probe")],
)
def test_bad_requests_raise(kwargs: dict[str, object], message: str) -> None:
    probes = kwargs.pop("probes", [])
    with pytest.raises(ValueError, match=message):
        runner().run(probes, **kwargs)  # type: ignore[arg-type]
