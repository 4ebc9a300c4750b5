"""The one error type every source raises; foreign errors are translated at the source boundary."""

from __future__ import annotations


class SourceError(Exception):
    """A source could not read what was asked.

    `source` names the source ("nvml", "sim", "host"); `gpu` is the GPU index when the failure is
    confined to one GPU; `lost` is true when the device is gone (fallen off the bus) and will not
    come back without a reset.
    """

    def __init__(self, source: str, message: str, *, gpu: int | None = None, lost: bool = False) -> None:
        where = f" (gpu {gpu})" if gpu is not None else ""
        super().__init__(f"{source}{where}: {message}")
        self.source = source
        self.gpu = gpu
        self.lost = lost
