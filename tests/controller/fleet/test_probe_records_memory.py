"""What a fleet holds of a probe result: its strings once for the whole fleet, one key tuple for
the result and its history, the history's points in the Series itself (fleet/model.py, state.py,
series.py). Each of these was one more object a result, 57 results a node."""

from __future__ import annotations

import copy
import gc
import pickle
from array import array

from controller.fleet.model import ProbeRecord
from controller.fleet.series import Series
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.simfleet import SimFleet


def _parsed(probe: str, variant: str, unit: str) -> pb.ProbeResult:
    """A result as a frame's parse gives it: its strings new objects, not the literals'."""
    wire = pb.ProbeResult(probe="".join(probe), variant="".join(variant), value=1.0, unit="".join(unit))
    return pb.ProbeResult.FromString(wire.SerializeToString())


def test_two_nodes_results_share_their_probe_variant_and_unit_strings() -> None:
    first = ProbeRecord.of("a", 0, _parsed("gemm", "bf16", "TFLOP/s"), 1.0)
    second = ProbeRecord.of("b", 1, _parsed("gemm", "bf16", "TFLOP/s"), 2.0)
    assert (first.probe, first.variant, first.unit) == ("gemm", "bf16", "TFLOP/s")
    assert first.probe is second.probe and first.variant is second.variant and first.unit is second.unit


def test_a_fleets_results_and_their_history_share_one_key_and_one_set_of_strings() -> None:
    sim = SimFleet(3)
    sim.step(probes=True)
    sim.step(probes=True)  # results of keys already held: their first key tuple stays
    fleet = sim.fleet
    assert len(fleet.probes) > 3 and fleet.probes.keys() == fleet.history.keys()
    history_keys = {key: key for key in fleet.history}
    for key in fleet.probes:
        assert history_keys[key] is key  # the same tuple in both maps
        assert len(fleet.history[key]) == 2
    probes = {id(r.probe) for r in fleet.probes.values()}
    names = {r.probe for r in fleet.probes.values()}
    assert len(probes) == len(names)  # one str object a probe name across the fleet


def test_a_series_is_its_own_array_of_doubles() -> None:
    series = Series([(1.0, 2.0), (3.0, 4.0)])
    assert isinstance(series, array) and series.typecode == "d"
    assert gc.get_referents(series) == [Series]  # nothing else held: one object a probe key
    assert len(series) == 2 and bool(series) and not Series()
    assert series.tobytes() == array("d", [1.0, 2.0, 3.0, 4.0]).tobytes()


def test_copies_and_pickles_of_a_series_are_series_of_the_same_points_and_independent() -> None:
    series = Series([(1.0, 2.0)])
    for other in (copy.copy(series), copy.deepcopy(series), pickle.loads(pickle.dumps(series))):
        assert type(other) is Series and other == series and other is not series
        other.add(5.0, 6.0)
        assert list(series) == [(1.0, 2.0)] and other != series
    assert Series([(1.0, 2.0)]) != array("d", [1.0, 2.0])  # points, not any array of the same doubles
