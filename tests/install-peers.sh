#!/usr/bin/env bash
# Install the real programs the test suite runs beside gpufleet, from Debian's packages:
#   prometheus                  prometheus, promtool (dashboards, alert rules, the e2e scrape)
#   prometheus-node-exporter    prometheus-node-exporter (bench/exporter_scrape.py's yardstick)
#   postgresql-15               initdb, postgres in /usr/lib/postgresql/15/bin, not on PATH
#                               (tests/postgres_server.py; $GPUFLEET_PG_BINDIR names another)
# Python peers (sushy-tools, trustme, CPU torch) come from pip in the Makefile.
#
# Run by `make test` (target `peers`). As root, or with password-less sudo, it installs what is
# missing; otherwise it prints the exact command and the tests that need these programs skip,
# except under CI=true, where this script fails so that no green run hides a missing peer.
set -euo pipefail

# binary -> Debian package
declare -A PACKAGE=(
  [prometheus]=prometheus
  [promtool]=prometheus
  [prometheus-node-exporter]=prometheus-node-exporter
)

PG_BINDIR=${GPUFLEET_PG_BINDIR:-/usr/lib/postgresql/15/bin}

missing=()
for binary in "${!PACKAGE[@]}"; do
  if ! command -v "$binary" >/dev/null 2>&1; then
    missing+=("${PACKAGE[$binary]}")
  fi
done
if [[ ! -x $PG_BINDIR/postgres ]]; then
  missing+=(postgresql-15)
fi
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
command_line="apt-get install -y --no-install-recommends ${packages[*]}"

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
  else
    echo "test peers missing: ${packages[*]}" >&2
    echo "  install them with: sudo $command_line" >&2
    if [[ ${CI:-} == true ]]; then
      echo "  CI=true: every peer is required, and this user cannot install them" >&2
      exit 1
    fi
    echo "  until then the tests that need them skip" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "test peers missing: ${packages[*]} (Debian packages; no apt-get on this machine)" >&2
  if [[ ${CI:-} == true ]]; then
    exit 1
  fi
  echo "  install Prometheus, promtool, the node exporter and PostgreSQL 15 another way" \
    "(GPUFLEET_PG_BINDIR: its bin directory); until then those tests skip" >&2
  exit 0
fi

echo "installing test peers: ${packages[*]}" >&2
install=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
  "${packages[@]}")
# A fresh image may have no package index yet: fetch it only when the install needs it.
if ! "${install[@]}" >/dev/null; then
  "${sudo[@]}" apt-get update -q >/dev/null
  "${install[@]}" >/dev/null
fi

# The packages enable and start their own servers (:9090, :9100, and PostgreSQL's cluster 15/main
# on :5432) where an init system runs. In a container without one nothing starts (invoke-rc.d finds
# no runlevel); elsewhere stop them: the tests start their own on free loopback ports.
for service in prometheus prometheus-node-exporter postgresql; do
  if [[ -d /run/systemd/system ]]; then
    "${sudo[@]}" systemctl disable --now "$service.service" >/dev/null 2>&1 || true
  elif [[ -x /etc/init.d/$service ]] && "${sudo[@]}" "/etc/init.d/$service" status >/dev/null 2>&1; then
    "${sudo[@]}" "/etc/init.d/$service" stop >/dev/null || true
  fi
done
# postgresql.service only fans out to postgresql@15-main.service; stop the cluster itself too.
if command -v pg_ctlcluster >/dev/null 2>&1 && "${sudo[@]}" pg_ctlcluster 15 main status >/dev/null 2>&1; then
  "${sudo[@]}" pg_ctlcluster 15 main stop >/dev/null 2>&1 || true
fi

for binary in "${!PACKAGE[@]}"; do
  if ! command -v "$binary" >/dev/null 2>&1; then
    echo "installed ${packages[*]}, yet $binary is still not on PATH" >&2
    exit 1
  fi
done
if [[ ! -x $PG_BINDIR/postgres ]]; then
  echo "installed ${packages[*]}, yet $PG_BINDIR/postgres is still missing" >&2
  exit 1
fi
