"""`gpufleet bmc`: read one BMC through Redfish and print the normalised snapshot.

The password never goes on the command line (it would show in `ps` and shell history): it comes
from --password-file, a --credentials-dir (a mounted Kubernetes secret) or $GPUFLEET_BMC_PASSWORD.
Exit status: 0 when every section was read, 1 when the BMC or a section failed (what was read is
still printed), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable

from agent import version
from agent.compose.bmc import endpoint
from agent.config import BmcConfig
from agent.jsonout import finite
from agent.sources.bmc import BmcSample
from agent.sources.redfish.credentials import ENV_PASSWORD, ENV_USERNAME
from agent.sources.redfish.session import BmcError
from protos.logsafe import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufleet bmc",
        description="Read a BMC through Redfish: temperatures, fans, power supplies, power, BIOS, "
        "firmware, logs and GPU baseboard sensors.",
        epilog=f"The password comes from --password-file, --credentials-dir or ${ENV_PASSWORD}; "
        f"the username from --username, --credentials-dir or ${ENV_USERNAME}.",
    )
    parser.add_argument("--url", required=True, help="the BMC, e.g. https://10.0.0.12")
    parser.add_argument("--username", help="BMC user")
    parser.add_argument("--password-file", metavar="FILE", help="a file holding only the password")
    parser.add_argument(
        "--credentials-dir", metavar="DIR", help="a directory with `username` and `password` files"
    )
    tls = parser.add_mutually_exclusive_group()
    tls.add_argument("--ca-bundle", metavar="FILE", help="PEM bundle that signed the BMC's certificate")
    tls.add_argument("--insecure", action="store_true", help="do not verify the BMC's TLS certificate")
    parser.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="read timeout per request (default 20)"
    )
    parser.add_argument(
        "--log-entries", type=int, metavar="N", help="most recent log entries to show (default 20)"
    )
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    parser.add_argument("--version", action="version", version=f"gpufleet bmc {version()}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging("WARNING", fmt="%(levelname)s %(name)s: %(message)s")  # BMC text escaped
    try:
        if args.timeout is not None and not math.isfinite(args.timeout):
            raise ValueError(f"--timeout must be a finite number of seconds, not {args.timeout}")
        given = {"read_timeout_seconds": args.timeout, "log_entries": args.log_entries}
        cfg = BmcConfig(
            url=args.url,
            username=args.username,
            password_file=args.password_file,
            credentials_dir=args.credentials_dir,
            ca_bundle=args.ca_bundle,
            insecure=args.insecure,
            **{key: value for key, value in given.items() if value is not None},
        )
        ep = endpoint(cfg, args.url)
    except (ValueError, BmcError) as exc:
        print(f"gpufleet bmc: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    from agent.sources.redfish.bmc import RedfishBmc

    progress: Callable[[str], None] | None = None
    if sys.stderr.isatty():

        def progress(step: str) -> None:
            print(f"\r\033[Kreading {step} ...", end="", file=sys.stderr, flush=True)

    bmc = RedfishBmc(
        ep, log_entries=cfg.log_entries, progress=progress, poll_timeout_seconds=cfg.poll_timeout_seconds
    )
    try:
        sample = bmc.poll()
    finally:
        bmc.close()
        if progress is not None:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
    if args.json:
        body = finite(dataclasses.asdict(sample))
        print(json.dumps(body, indent=2, sort_keys=True, allow_nan=False))
    else:
        print(render(sample))
    if sample.error:
        print(f"gpufleet bmc: {sample.error}", file=sys.stderr)
    return 0 if sample.success else 1


def _num(value: float | None, unit: str, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f} {unit}"


def render(s: BmcSample) -> str:
    """A human-readable report of one sample: the readings an operator looks at first."""
    out = [
        f"BMC {s.endpoint}  {s.manufacturer} {s.model}  serial {s.serial or '-'}  "
        f"(auth {s.auth or 'none'}, {s.requests} requests, {s.poll_duration_seconds:.1f} s)",
        f"health: system {s.system_health or '-'}, chassis {s.chassis_health or '-'}; "
        f"power {_num(s.power_consumed_watts, 'W')}; BMC firmware {s.bmc_firmware_version or '-'}",
    ]
    if s.error:
        return "\n".join([*out[:1], f"ERROR: {s.error}"])
    failed = [f"{x.name} ({x.error})" for x in s.sections if not x.success]
    if failed:
        out.append("failed sections: " + "; ".join(failed))
    if s.temperatures:
        out.append("temperatures:")
        for t in s.temperatures:
            limits = "/".join(
                _num(v, "").strip()
                for v in (t.upper_caution_celsius, t.upper_critical_celsius, t.upper_fatal_celsius)
            )
            out.append(
                f"  {t.name:<36} {t.context:<12} {_num(t.reading_celsius, 'C', 1):>8}  "
                f"caution/critical/fatal {limits}  {t.health or t.state}"
            )
    if s.fans:
        out.append("fans:")
        out.extend(
            f"  {f.name:<36} {_num(f.speed_rpm, 'rpm'):>10} "
            f"{'-' if f.speed_ratio is None else f'{f.speed_ratio:.0%}':>5}  {f.health or f.state}"
            for f in s.fans
        )
    if s.power_supplies:
        out.append(
            f"power supplies (redundancy {s.power_supply_redundancy_mode or '-'} "
            f"{s.power_supply_redundancy_health or ''}):".replace(" )", ")")
        )
        out.extend(
            f"  {p.name:<36} in {_num(p.input_watts, 'W'):>8} out {_num(p.output_watts, 'W'):>8} "
            f"of {_num(p.capacity_watts, 'W'):>8}  {p.health or p.state}"
            for p in s.power_supplies
        )
    if s.gpus:
        out.append("GPU baseboards:")
        out.extend(
            f"  gpu {g.index} {g.chassis:<20} {_num(g.temperature_celsius, 'C', 1):>8} "
            f"mem {_num(g.memory_temperature_celsius, 'C', 1):>8} {_num(g.power_watts, 'W'):>8}  "
            f"matched by {g.matched_by}"
            for g in s.gpus
        )
    out.append(
        f"BIOS {s.bios_version or '-'}: {len(s.bios_attributes)} attributes, {len(s.bios_pending)} pending"
    )
    out.extend(f"  pending {name} = {value}" for name, value in sorted(s.bios_pending.items()))
    if s.bios_apply_times:
        out.append(f"  settings apply times: {', '.join(s.bios_apply_times)}")
    if s.firmware:
        out.append("firmware:")
        out.extend(f"  {f.id:<28} {f.version:<24} {'updateable' if f.updateable else ''}" for f in s.firmware)
    if s.log_entries:
        out.append("recent log entries:")
        out.extend(f"  {e.created:<26} {e.severity:<9} {e.message}" for e in s.log_entries)
    return "\n".join(out)


if __name__ == "__main__":
    from agent import pipes

    sys.exit(pipes.run(main))
