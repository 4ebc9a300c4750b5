"""Asks one GPU its queries: field values in one batch, calls one by one, and sorts out what failed.

NOT_SUPPORTED (or a function or field this pynvml or driver lacks) is remembered per GPU and query:
a field value falls back to its query's call, a call is never asked again and its fields are listed
as unsupported. GPU_IS_LOST raises GpuLost. Any other failure leaves the query's fields unset for
this cycle and is described in the caller's error list.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

from agent.sources.nvml.query import Query, error_code

# Union members of c_nvmlValue_t by the field value's valueType, and their width in bits.
_VALUE_MEMBERS = {
    "NVML_VALUE_TYPE_DOUBLE": ("dVal", 64),
    "NVML_VALUE_TYPE_UNSIGNED_INT": ("uiVal", 32),
    "NVML_VALUE_TYPE_UNSIGNED_LONG": ("ulVal", 64),
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": ("ullVal", 64),
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": ("sllVal", 64),
    "NVML_VALUE_TYPE_SIGNED_INT": ("siVal", 32),
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": ("usVal", 16),
}


class GpuLost(Exception):
    """NVML_ERROR_GPU_IS_LOST: the GPU is gone until it is reset; stop asking it anything."""


@dataclass(frozen=True, slots=True)
class CounterSample:
    """A raw counter field value: its value, its width in bits (it wraps), and when NVML read it."""

    value: int
    bits: int
    time_us: int


@dataclass(slots=True)
class Subject:
    """What queries are asked about: the GPU (args (handle,)) or one NVLink (args (handle, link),
    scope the link). Answers land in `values`, by reading field name."""

    values: dict[str, Any]
    args: tuple[Any, ...]
    scope: int | None = None
    where: str = ""


class QueryRunner:
    """Asks NVML queries for the GPUs of one source and remembers what each GPU cannot answer."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._unsupported_codes = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND}
        # A field id this driver does not know answers INVALID_ARGUMENT in its own status.
        self._missing_field_codes = self._unsupported_codes | {nvml.NVML_ERROR_INVALID_ARGUMENT}
        self._members = {
            getattr(nvml, const): member for const, member in _VALUE_MEMBERS.items() if hasattr(nvml, const)
        }
        self._skip: set[tuple[int, str]] = set()  # (gpu, query label) never asked again
        self._by_call: set[tuple[int, str]] = set()  # (gpu, query label) whose field values are missing
        self._unsupported: dict[int, list[str]] = {}

    def unsupported(self, index: int) -> list[str]:
        """The reading fields GPU `index` has answered NOT_SUPPORTED for, in the order found."""
        return list(self._unsupported.get(index, []))

    def ask(self, index: int, query: Query, errors: list[str], *args: Any, where: str = "") -> Any:
        """`query.call(*args)`, or None when it failed or is known to be unsupported."""
        if (index, query.label) in self._skip or query.call is None:
            return None
        nvml = self._nvml
        try:
            return query.call(nvml, *args)
        except nvml.NVMLError as exc:
            code = error_code(exc)
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost from exc
            if code in self._unsupported_codes:
                self._mark_unsupported(index, query)
                return None
            errors.append(f"gpu {index} {query.label}{where}: {exc}")
            return None

    def fill(
        self, values: dict[str, Any], index: int, query: Query, errors: list[str], *args: Any, where: str = ""
    ) -> None:
        """Set `query`'s fields in `values` from its call; leave them as they are when it failed."""
        raw = self.ask(index, query, errors, *args, where=where)
        if raw is not None:
            values.update(zip(query.fields, query.convert(raw), strict=True))

    def run(
        self,
        index: int,
        handle: Any,
        queries: tuple[Query, ...],
        subjects: list[Subject],
        errors: list[str],
        *,
        slow: bool = True,
        cache: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Answer `queries` for each subject: field values in one nvmlDeviceGetFieldValues, then calls.

        A slow query answered by its call is asked only when `slow` is true (or it has no answer in
        `cache` yet); otherwise its last answer is copied from `cache`.
        """
        batch = [q for q in queries if q.field_ids and not self._known(index, q)]
        if batch:
            self._read_fields(index, handle, batch, subjects, errors)
        for query in queries:
            key = (index, query.label)
            if query.call is None or key in self._skip or (query.field_ids and key not in self._by_call):
                continue
            for subject in subjects:
                if query.slow and not slow and cache is not None and query.label in cache:
                    subject.values.update(copy.deepcopy(cache[query.label]))
                    continue
                self.fill(subject.values, index, query, errors, *subject.args, where=subject.where)
                if query.slow and cache is not None:
                    cache[query.label] = {f: copy.deepcopy(subject.values.get(f)) for f in query.fields}

    # Internals

    def _known(self, index: int, query: Query) -> bool:
        key = (index, query.label)
        return key in self._skip or key in self._by_call

    def _mark_unsupported(self, index: int, query: Query) -> None:
        self._skip.add((index, query.label))
        unsupported = self._unsupported.setdefault(index, [])
        unsupported.extend(n for n in query.unsupported_names if n not in unsupported)

    def _field_missing(self, index: int, query: Query) -> None:
        """The driver lacks `query`'s field values: its call stands in from now on, if it has one."""
        if query.call is not None:
            self._by_call.add((index, query.label))
        else:
            self._mark_unsupported(index, query)

    def _read_fields(
        self, index: int, handle: Any, batch: list[Query], subjects: list[Subject], errors: list[str]
    ) -> None:
        nvml = self._nvml
        ids: list[Any] = []
        slots: list[tuple[Query, Subject, int]] = []
        for query in batch:
            resolved = [getattr(nvml, name, None) for name in query.field_ids]
            if None in resolved:  # this pynvml predates the field
                self._field_missing(index, query)
                continue
            for subject in subjects:
                scope = subject.scope if subject.scope is not None else query.scope
                slots.append((query, subject, len(ids)))
                ids.extend(fid if scope is None else (fid, scope) for fid in resolved)
        if not ids:
            return
        try:
            answers = nvml.nvmlDeviceGetFieldValues(handle, ids)
        except nvml.NVMLError as exc:
            code = error_code(exc)
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost from exc
            if code in self._unsupported_codes:
                for query in batch:
                    if not self._known(index, query):
                        self._field_missing(index, query)
            else:
                errors.append(f"gpu {index} field values: {exc}")
            return
        now_us = int(time.time() * 1e6)
        for query, subject, start in slots:
            if self._known(index, query):  # found missing on an earlier subject
                continue
            answer = answers[start : start + len(query.field_ids)]
            codes = [int(a.nvmlReturn) for a in answer]
            if nvml.NVML_ERROR_GPU_IS_LOST in codes:
                raise GpuLost
            if any(code in self._missing_field_codes for code in codes):
                self._field_missing(index, query)
                continue
            failed = next((code for code in codes if code != nvml.NVML_SUCCESS), None)
            if failed is not None:
                errors.append(f"gpu {index} {query.label}{subject.where}: {nvml.NVMLError(failed)}")
                continue
            decoded = [self._decode(a) for a in answer]
            if None in decoded:
                errors.append(f"gpu {index} {query.label}{subject.where}: unknown field value type")
                continue
            for name, unit, a, value in zip(query.fields, query.units, answer, decoded, strict=True):
                assert value is not None
                number, bits = value
                if query.counter:
                    subject.values[name] = CounterSample(int(number), bits, int(a.timestamp) or now_us)
                else:
                    subject.values[name] = unit(number)

    def _decode(self, answer: Any) -> tuple[Any, int] | None:
        member = self._members.get(int(answer.valueType))
        if member is None:
            return None
        name, bits = member
        return getattr(answer.value, name), bits
