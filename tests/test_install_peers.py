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


def _bin(tmp_path: Path, *, uid: int, present: tuple[str, ...] = ()) -> Path:
    """A PATH holding bash and sort, an `id` that answers `uid`, no sudo, no apt-get, and stand-ins
    for the peers in `present`."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
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
    env = {"PATH": str(bindir), "CI": ci, "HOME": os.environ.get("HOME", "/")}
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


def test_nothing_is_done_when_every_peer_is_there(tmp_path: Path) -> None:
    peers = ("prometheus", "promtool", "prometheus-node-exporter")
    proc = _run(_bin(tmp_path, uid=0, present=peers), "true")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_root_without_apt_fails_in_ci(tmp_path: Path) -> None:
    proc = _run(_bin(tmp_path, uid=0), "true")
    assert proc.returncode == 1
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
