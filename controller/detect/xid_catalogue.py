"""NVIDIA's XID catalogue as data: what each XID code means, what kind of fault it points to, how
bad it is and what it takes to recover (after NVIDIA's XID catalogue for Ampere and newer GPUs,
and its page-retirement and row-remapping notes; the lines here are our own summaries).

Classes: "hardware" (the GPU itself), "memory" (HBM/SRAM ECC, row remapping), "interconnect"
(NVLink, C2C), "bus" (PCIe, the GPU gone from the bus), "firmware" (GSP and on-chip
micro-controllers), "driver" (the kernel driver or its programming of the GPU), "application" (a
user's program faulted: bad address, illegal instruction, killed channel).

`reset`: the GPU needs a reset (or the node a reboot) to be trusted again. `drain`: stop scheduling
work on it until then. `repeat`: for an application or driver code, how many in the detection
window make it suspicious of the hardware (one program's bug repeats within its job; the same code
across many jobs on one GPU is not a program's bug); None: never a finding on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

CLASSES = ("hardware", "memory", "interconnect", "bus", "firmware", "driver", "application")
# XIDs that report an HBM row being remapped (or failing to be): row_remap.py already raises
# ecc_row_remap_pending for a GPU whose remap is pending, and these join that finding.
ROW_REMAP_CODES = frozenset({63, 64, 94})


@dataclass(frozen=True, slots=True)
class Xid:
    name: str  # short meaning, as evidence shows it: "XID 79 (GPU fallen off the bus)"
    klass: str  # one of CLASSES
    severity: str  # "critical" or "warning": how bad a finding it makes
    reset: bool = False  # recovering needs a GPU reset or a reboot
    drain: bool = False  # move work off the GPU until it is reset or repaired
    repeat: int | None = None  # application/driver codes: this many in the window is suspicious

    @property
    def signals_fault(self) -> bool:
        """A finding from a single event: a hardware-side class, or anything that needs a reset."""
        return self.reset or self.klass not in ("application", "driver")


CATALOGUE: dict[int, Xid] = {
    8: Xid("GPU stopped processing: channel idle timeout", "driver", "warning", repeat=10),
    13: Xid("graphics engine exception", "application", "warning", repeat=20),
    31: Xid("GPU memory page fault (illegal address)", "application", "warning", repeat=20),
    32: Xid("corrupted push buffer stream: bus or memory corruption", "bus", "warning"),
    38: Xid("driver firmware error", "firmware", "warning", reset=True),
    43: Xid(
        "GPU stopped processing: channel reset after a program error", "application", "warning", repeat=20
    ),
    45: Xid("preemptive channel cleanup after an earlier error", "application", "warning"),
    48: Xid("double-bit ECC error", "memory", "critical", reset=True, drain=True),
    56: Xid("display engine error", "driver", "warning", repeat=10),
    57: Xid("error programming the video memory interface", "hardware", "critical", reset=True, drain=True),
    61: Xid("internal micro-controller breakpoint or warning", "firmware", "warning", reset=True),
    62: Xid("internal micro-controller halt", "firmware", "critical", reset=True, drain=True),
    63: Xid(
        "HBM row remap or page retirement recorded: takes effect at reset", "memory", "warning", reset=True
    ),
    64: Xid("HBM row remap or page retirement failed", "memory", "critical", reset=True, drain=True),
    68: Xid("video decoder exception", "application", "warning", repeat=20),
    69: Xid("graphics engine class error", "driver", "warning", repeat=10),
    74: Xid("NVLink error", "interconnect", "critical", reset=True, drain=True),
    79: Xid("GPU fallen off the bus", "bus", "critical", reset=True, drain=True),
    92: Xid("high single-bit ECC error rate", "memory", "warning"),
    94: Xid(
        "contained uncorrectable ECC error: the faulting program was stopped", "memory", "warning", reset=True
    ),
    95: Xid("uncontained uncorrectable ECC error", "memory", "critical", reset=True, drain=True),
    109: Xid("context switch timeout", "driver", "warning", repeat=10),
    110: Xid("security fault", "hardware", "critical", reset=True, drain=True),
    119: Xid("GSP firmware call timed out", "firmware", "critical", reset=True, drain=True),
    120: Xid("GSP firmware error", "firmware", "critical", reset=True, drain=True),
    121: Xid("C2C link corrected error", "interconnect", "warning"),
    123: Xid("SPI flash read or write failure", "hardware", "warning"),
    140: Xid("unrecovered ECC error", "memory", "critical", reset=True, drain=True),
    143: Xid("GPU initialisation failure", "hardware", "critical", reset=True, drain=True),
    144: Xid("NVLink SAW error", "interconnect", "critical", reset=True, drain=True),
    145: Xid("NVLink RLW error", "interconnect", "critical", reset=True, drain=True),
    146: Xid("NVLink TLW error", "interconnect", "critical", reset=True, drain=True),
    147: Xid("NVLink TREX error", "interconnect", "critical", reset=True, drain=True),
    148: Xid("NVLink NVLPW control error", "interconnect", "critical", reset=True, drain=True),
    149: Xid("NVLink NETIR error", "interconnect", "critical", reset=True, drain=True),
    150: Xid("NVLink MSE error", "interconnect", "critical", reset=True, drain=True),
    154: Xid(
        "GPU recovery action changed: see its recovery action (reset, reboot)",
        "hardware",
        "warning",
        reset=True,
    ),
}


def describe(code: int) -> str:
    """'XID 79 (GPU fallen off the bus)', or 'XID 200 (not in catalogue)'."""
    entry = CATALOGUE.get(code)
    return f"XID {code} ({entry.name if entry else 'not in catalogue'})"
