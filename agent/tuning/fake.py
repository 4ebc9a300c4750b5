"""A recording fake of the host tree for tests and dry-run checks.

`KernelTree` behaves as the kernel's files do where a plain file would not: a write to a choice
file ("always [madvise] never") moves the brackets, and a word it does not list is refused with
EINVAL; a cpufreq governor not in scaling_available_governors is refused; nr_hugepages takes at
most `hugepages_cap` pages. Every write is recorded in `writes`; with `perform=False` nothing is
written at all. Faults: `fail_write_at` (the Nth write raises `fault`), `fail_paths` (a write to
that file raises the given error), `fail_read_once` (the next read of that file after a write
raises EIO, once).
"""

from __future__ import annotations

import errno
import os

from agent.tuning.base import Tree, translate


class KernelTree(Tree):
    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        perform: bool = True,
        hugepages_cap: int | None = None,
        fail_write_at: int | None = None,
        fault: BaseException | None = None,
        fail_paths: dict[str, OSError] | None = None,
        fail_read_once: set[str] | None = None,
    ) -> None:
        super().__init__(root)
        self.perform = perform
        self.hugepages_cap = hugepages_cap
        self.fail_write_at = fail_write_at
        self.fault = fault or OSError(errno.EIO, os.strerror(errno.EIO))
        self.fail_paths = dict(fail_paths or {})
        self.fail_read_once = set(fail_read_once or ())
        self._armed: set[str] = set()
        self.attempts = 0
        self.writes: list[tuple[str, str]] = []

    def check_writable(self, rel: str) -> None:
        if rel in self.fail_paths:
            raise translate(self.fail_paths[rel], rel, "write")
        super().check_writable(rel)

    def _read(self, rel: str) -> str:
        if rel in self._armed:
            self._armed.discard(rel)
            self.fail_read_once.discard(rel)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return super()._read(rel)

    def _write(self, rel: str, value: str) -> None:
        self.attempts += 1
        if self.attempts == self.fail_write_at:
            raise self.fault
        if rel in self.fail_paths:
            raise self.fail_paths[rel]
        old = super()._read(rel)
        if rel.endswith("scaling_governor"):
            available = self.path(rel).with_name("scaling_available_governors")
            if available.exists() and value not in available.read_text().split():
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        text = value
        if "[" in old:
            words = [w.strip("[]") for w in old.split()]
            if value not in words:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            text = " ".join(f"[{w}]" if w == value else w for w in words)
        elif rel == "proc/sys/vm/nr_hugepages" and self.hugepages_cap is not None:
            text = str(min(int(value), self.hugepages_cap))
        self.writes.append((rel, value))
        if rel in self.fail_read_once:
            self._armed.add(rel)
        if self.perform:
            super()._write(rel, text)
