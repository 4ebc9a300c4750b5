"""What one BMC poll costs: wall time, HTTP requests, and the size of the BMC section on the wire.

Polls a real BMC (or any Redfish service) with the agent's own source, or the simulator's BMC, N
times in a row, the way the agent's poller does (one session kept across polls, BIOS and firmware
re-read every `--inventory-every` polls). Prints figures; asserts nothing.

    .venv/bin/python bench/bmc_poll.py --url https://BMC [--polls 10] [--insecure | --ca-bundle F]
    .venv/bin/python bench/bmc_poll.py --sim

Credentials come from $GPUFLEET_BMC_USERNAME / $GPUFLEET_BMC_PASSWORD (or --password-file).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from agent.sources.bmc import BmcSource
from agent.sources.errors import SourceError
from agent.stream.frames import bmc_sample


def build(args: argparse.Namespace) -> BmcSource:
    if args.sim:
        from agent.sources.sim import SimNode
        from agent.sources.sim.bmc import SimBmc

        return SimBmc(SimNode("bench-node"))
    from agent.compose.bmc import endpoint
    from agent.config import BmcConfig
    from agent.sources.redfish.bmc import RedfishBmc

    cfg = BmcConfig(
        url=args.url,
        username=args.username,
        password_file=args.password_file,
        ca_bundle=args.ca_bundle,
        insecure=args.insecure,
    )
    return RedfishBmc(endpoint(cfg, args.url), inventory_every=args.inventory_every)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="the BMC's base URL")
    where.add_argument("--sim", action="store_true", help="the simulator's BMC")
    parser.add_argument("--polls", type=int, default=10)
    parser.add_argument("--inventory-every", type=int, default=10)
    parser.add_argument("--username", help="default: $GPUFLEET_BMC_USERNAME")
    parser.add_argument("--password-file")
    parser.add_argument("--ca-bundle")
    parser.add_argument("--insecure", action="store_true")
    args = parser.parse_args()
    try:
        source = build(args)
    except SourceError as exc:  # BmcError: credentials or URL unusable
        print(f"bmc_poll: {exc}", file=sys.stderr)
        return 2
    walls, requests, sizes = [], [], []
    try:
        for _ in range(args.polls):
            start = time.perf_counter()
            sample = source.poll()
            walls.append(time.perf_counter() - start)
            requests.append(sample.requests)
            sizes.append(len(bmc_sample(sample).SerializeToString()))
            if sample.error:
                print(f"poll failed: {sample.error}")
    finally:
        source.close()
    walls_ms = sorted(w * 1e3 for w in walls)
    print(f"bmc_poll: {source.endpoint}, {args.polls} polls")
    later = [w * 1e3 for w in walls[1:]] or walls_ms
    print(
        f"  wall per poll   first {walls[0] * 1e3:.1f} ms, then mean {statistics.fmean(later):.1f}"
        f"  p50 {statistics.median(later):.1f}  max {max(later):.1f} ms"
    )
    print(f"  requests/poll   first {requests[0]}, then {sorted(set(requests[1:]))}")
    print(f"  BmcSample bytes first {sizes[0]}, then mean {statistics.fmean(sizes[1:] or sizes):.0f}")
    print(
        f"  sample: {len(sample.temperatures)} temperatures, {len(sample.fans)} fans, "
        f"{len(sample.power_supplies)} PSUs, {len(sample.gpus)} GPU boards, "
        f"{len(sample.bios_attributes)} BIOS attributes, {len(sample.firmware)} firmware, "
        f"{len(sample.log_entries)} log entries"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
