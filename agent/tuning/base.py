"""What every actuator shares: the one error type, a planned change, the host tree it reads and
writes through (errors translated there), and the Actuator protocol.

Paths are kernel paths relative to the host root ("proc/sys/vm/swappiness"); the root is `/` on
bare metal, `/host` in a DaemonSet and a temp tree in tests.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.tuning.targets import Targets


class TuningError(Exception):
    """A setting could not be read, validated or written; the message says why, in one line."""


class Shortfall(TuningError):
    """The kernel took less than asked (hugepages on fragmented memory): a partial apply."""


@dataclass(frozen=True, slots=True)
class Change:
    """One setting to move from `current` to `target` (both as the kernel file spells them)."""

    setting: str
    current: str
    target: str
    pending_reboot: bool = False  # takes effect at the next reboot (BIOS, ECC): read back as pending

    def reverse(self) -> Change:
        return Change(self.setting, self.target, self.current, self.pending_reboot)


def _shown(rel: str) -> str:
    return "/" + rel.lstrip("/")


class Tree:
    """The host's /proc and /sys under `root`: reads and writes, foreign errors made TuningErrors.

    Writes open the existing file (never create one: a missing file means the kernel lacks it).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, rel: str) -> Path:
        return self.root / rel

    def exists(self, rel: str) -> bool:
        return self.path(rel).exists()

    def glob(self, pattern: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.glob(pattern))

    def read(self, rel: str) -> str:
        try:
            return self._read(rel)
        except OSError as exc:
            raise translate(exc, rel, "read") from None

    def write(self, rel: str, value: str) -> None:
        try:
            self._write(rel, value)
        except OSError as exc:
            raise translate(exc, rel, "write", value) from None

    def check_writable(self, rel: str) -> None:
        """Refuse before any write when the file cannot be written (missing, or not permitted)."""
        path = self.path(rel)
        if not path.exists():
            raise translate(FileNotFoundError(errno.ENOENT, "missing"), rel, "write")
        if not os.access(path, os.W_OK):
            raise translate(PermissionError(errno.EACCES, "denied"), rel, "write")

    def _read(self, rel: str) -> str:
        return self.path(rel).read_text()

    def _write(self, rel: str, value: str) -> None:
        fd = os.open(self.path(rel), os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, f"{value}\n".encode())
        finally:
            os.close(fd)


def translate(exc: OSError, rel: str, verb: str, value: str | None = None) -> TuningError:
    """One clear line for an OSError met reading or writing a kernel file."""
    shown = _shown(rel)
    if isinstance(exc, PermissionError) or exc.errno in (errno.EPERM, errno.EACCES):
        return TuningError(f"needs root (or CAP_SYS_ADMIN) to {verb} {shown}")
    if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
        return TuningError(f"not supported on this kernel: {shown} does not exist")
    if exc.errno in (errno.EINVAL, errno.ERANGE, errno.EBUSY) and value is not None:
        return TuningError(f"the kernel refused {value!r} for {shown}: {os.strerror(exc.errno)}")
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return TuningError(f"could not {verb} {shown}: {reason}")


class Actuator(Protocol):
    """One small adapter per kind of setting: read, plan (diff), validate, apply, verify."""

    name: str

    def read(self, tree: Tree) -> dict[str, str]:
        """Every setting this actuator knows on this host, with its current value."""
        ...

    def plan(self, tree: Tree, targets: Targets) -> list[Change]:
        """The changes that take the host from its current values to `targets` ([] when there).
        Actuators of other levels (GPU through NVML, BIOS through Redfish) hold their own handle
        and ignore `tree`."""
        ...

    def validate(self, tree: Tree, change: Change) -> None:
        """Raise TuningError when the target (or the file) would be refused; writes nothing."""
        ...

    def apply(self, tree: Tree, change: Change) -> None:
        """Write change.target."""
        ...

    def verify(self, tree: Tree, change: Change) -> None:
        """Read back; raise TuningError (Shortfall for a partial take) unless at change.target."""
        ...
