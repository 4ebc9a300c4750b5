"""tests/install-peers.sh, which `make test` runs: the real programs the suite needs, or the exact
command to get them; under CI=true a peer that cannot be installed fails the run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "install-peers.sh"
MAKEFILE = ROOT / "Makefile"
CI_RUN = ROOT / ".ci" / "run"


def _bin(tmp_path: Path, *, uid: int, present: tuple[str, ...] = (), postgres: bool = True) -> Path:
    """A PATH holding bash and sort, an `id` that answers `uid`, no sudo, no apt-get, and stand-ins
    for the peers in `present`; beside it pg/, the $GPUFLEET_PG_BINDIR `_run` passes, holding a
    stand-in `postgres` when `postgres`."""
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True)
    pg_bindir = tmp_path / "pg"
    pg_bindir.mkdir()
    if postgres:
        (pg_bindir / "postgres").write_text(f"#!{shutil.which('bash')}\nexit 0\n")
        (pg_bindir / "postgres").chmod(0o755)
    for tool in ("bash", "sort", "env"):
        found = shutil.which(tool)
        assert found is not None
        (bindir / tool).symlink_to(found)
    (bindir / "id").write_text(f"#!{shutil.which('bash')}\necho {uid}\n")
    for name in present:
        (bindir / name).write_text(f"#!{shutil.which('bash')}\nexit 0\n")
    for path in bindir.iterdir():
        if not path.is_symlink():
            path.chmod(0o755)
    return bindir


def _run(bindir: Path, ci: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": str(bindir),
        "CI": ci,
        "HOME": os.environ.get("HOME", "/"),
        "GPUFLEET_PG_BINDIR": str(bindir.parent / "pg"),
    }
    return subprocess.run(
        [str(bindir / "bash"), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_user_who_cannot_install_is_told_the_exact_command(tmp_path: Path, ci: str) -> None:
    proc = _run(_bin(tmp_path, uid=1000, present=("promtool",)), ci)
    wanted = "sudo apt-get install -y --no-install-recommends prometheus prometheus-node-exporter"
    assert wanted in proc.stderr
    if ci:
        assert proc.returncode == 1, "under CI=true a peer that cannot be installed must fail the run"
        assert "CI=true" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert "skip" in proc.stderr


def test_only_the_missing_package_is_named(tmp_path: Path) -> None:
    proc = _run(_bin(tmp_path, uid=1000, present=("prometheus", "promtool")), "")
    assert "install -y --no-install-recommends prometheus-node-exporter\n" in proc.stderr


def test_postgresql_15_is_named_when_its_postgres_is_missing(tmp_path: Path) -> None:
    peers = ("prometheus", "promtool", "prometheus-node-exporter")
    proc = _run(_bin(tmp_path, uid=1000, present=peers, postgres=False), "")
    assert proc.returncode == 0, proc.stderr
    assert "sudo apt-get install -y --no-install-recommends postgresql-15\n" in proc.stderr
    # Its binaries are not on PATH: a `postgres` there does not count.
    peers_and_a_stray_postgres = (*peers, "postgres")
    proc = _run(_bin(tmp_path / "again", uid=1000, present=peers_and_a_stray_postgres, postgres=False), "")
    assert "install -y --no-install-recommends postgresql-15\n" in proc.stderr


def test_nothing_is_done_when_every_peer_is_there(tmp_path: Path) -> None:
    peers = ("prometheus", "promtool", "prometheus-node-exporter")
    proc = _run(_bin(tmp_path, uid=0, present=peers), "true")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_root_without_apt_fails_in_ci(tmp_path: Path) -> None:
    proc = _run(_bin(tmp_path, uid=0, postgres=False), "true")
    assert proc.returncode == 1
    assert "test peers missing: postgresql-15 prometheus prometheus-node-exporter (" in proc.stderr
    assert "no apt-get" in proc.stderr


def test_make_test_installs_the_peers_and_ci_runs_nothing_else() -> None:
    makefile = MAKEFILE.read_text()
    assert "\ntest: lint peers\n" in makefile
    assert "\tpeers:" not in makefile and "tests/install-peers.sh" in makefile
    commands = [
        line.strip()
        for line in CI_RUN.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "exec make test"]
