"""Looping over a repeated message field on ingest's hot path.

The upb runtime's repeated containers have no __iter__: a for loop over one (or map, all, a
comprehension, star-unpacking) falls back to indexing it until an IndexError, and raising that costs
more than the rest of a short loop. On the development machine an empty field's loop took 0.86 us
against 0.06 us for asking whether it has items, and a GPU's 18 NVLinks 4.7 us against 2.5 us
through a slice (one C call that makes the items' wrappers into a list). A frame loops over its GPUs
and each GPU's XID events (nearly always none) several times on its way in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def each(repeated: Sequence[T]) -> Sequence[T]:
    """The field's items to loop over: a list of them, or () when it has none."""
    return repeated[:] if repeated else ()
