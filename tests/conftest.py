"""Fixtures for every test: the Redfish servers (tests/redfish_servers.py), Prometheus and PostgreSQL
are imported here so pytest sees them; `require` and `free_port` live in tests/support.py and are
re-exported."""

from __future__ import annotations

import os

from tests.postgres_server import postgres_server  # noqa: F401 - imported to register the fixture
from tests.prometheus_server import prometheus_server  # noqa: F401 - imported to register the fixture
from tests.redfish_servers import (  # noqa: F401 - imported to register the fixtures
    dmtf_mockup,
    fake_bmc,
    hgx_bmc,
    slow_bmc,
    sushy_emulator,
    sushy_static_server,
    tls_files,
    unreachable_url,
)
from tests.store_backends import store_db  # noqa: F401 - imported to register the fixture
from tests.support import IN_CI, free_port, require

__all__ = ["IN_CI", "free_port", "require"]

# The controller falls back to $KUBECONFIG and the in-cluster service account: a test must never
# reach (and patch the nodes of) whatever cluster the machine running it is set up for.
for _name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
    os.environ.pop(_name, None)
# No gRPC fork handlers in the test processes (read when gRPC starts, after this: nothing above
# imports it). Starting PostgreSQL as its own user forks (no vfork with a uid change), and gRPC's
# handlers, with its threads busy, crashed the child before it ran initdb (status -11). The
# controller forks nothing with gRPC in it (controller/children.py).
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
# Tables are laid out for a pipe unless a test sets $COLUMNS itself: the width of the terminal the
# suite was started from (or the 80 columns pytest-xdist gives its workers) must not change them.
# Set, then deleted: GNU readline, which pytest imports before this file, sets them in the C
# environment only, out of os.environ's sight, where a pop finds nothing to unset and every
# subprocess would inherit COLUMNS=80 (a run without -n printed bench/cli_tables.py's table narrowed).
for _name in ("COLUMNS", "LINES"):
    os.environ[_name] = ""
    del os.environ[_name]
# One thread for torch's CPU kernels in the suite's processes (and what they start): `make test`
# runs two pytest processes on CI's two cores, and two GEMMs of two OpenMP threads each spin-wait
# on each other's cores (bench/probe_quality.py's probe/independent ratio read 0.06 to 12,000 so).
os.environ["OMP_NUM_THREADS"] = "1"
