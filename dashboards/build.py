"""Write the Grafana dashboards: `python -m dashboards.build` (or `python dashboards/build.py`).

`--check` writes nothing and exits 1, naming the files, when a committed dashboard differs from
what the code generates now.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

if not __package__:  # run as a script: make `dashboards` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dashboards import controller, fleet, node
from dashboards.grafana import JSON

DIRECTORY = Path(__file__).resolve().parent
DASHBOARDS: dict[str, Callable[[], JSON]] = {
    "gpufleet-fleet.json": fleet.build,
    "gpufleet-node.json": node.build,
    "gpufleet-controller.json": controller.build,
}


def render(dashboard: JSON) -> str:
    """The committed form: sorted keys (as Grafana exports them), 2-space indent, trailing newline."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generate() -> dict[str, str]:
    """File name -> the JSON text the code produces now."""
    return {name: render(build()) for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    args = parser.parse_args(argv)
    stale = []
    for name, text in generate().items():
        path = DIRECTORY / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run python -m dashboards.build", file=sys.stderr)
        return 1
    for name in stale if not args.check else []:
        print(f"wrote dashboards/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
