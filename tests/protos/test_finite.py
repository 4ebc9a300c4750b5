"""protos/finite.py: the first NaN or infinity in a loaded configuration, named by its path."""

from __future__ import annotations

import math

from protos.finite import finite_message, non_finite


def test_every_finite_number_passes_and_the_first_non_finite_one_is_named_by_its_path() -> None:
    assert non_finite({"a": 1, "b": [0.5, {"c": -2.0}], "d": "nan", "e": None, "f": True}) is None
    assert non_finite({"a": {"b": [1.0, {"c": math.inf}]}}) == ("a.b[1].c", math.inf)
    found = non_finite({"x": 1.0, "y": {"z": math.nan}})
    assert found is not None and found[0] == "y.z" and math.isnan(found[1])
    assert finite_message(("detect.interval_seconds", -math.inf)) == (
        "detect.interval_seconds must be a finite number, not -inf"
    )
