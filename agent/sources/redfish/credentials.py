"""BMC credentials from a file, a mounted Kubernetes secret or the environment, never the command line.

Order: the username as configured, else the secret's `username` file, else $GPUFLEET_BMC_USERNAME;
the password from `password_file`, else the secret's `password` file, else $GPUFLEET_BMC_PASSWORD.
A file's trailing newline is not part of the secret (`echo secret > file` writes one).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from agent.sources.redfish.session import BmcError, Credentials

log = logging.getLogger("gpufleet.agent.bmc")
ENV_USERNAME = "GPUFLEET_BMC_USERNAME"
ENV_PASSWORD = "GPUFLEET_BMC_PASSWORD"


def _read_secret(path: Path, what: str) -> str:
    try:
        value = path.read_text()
    except OSError as exc:
        raise BmcError(f"cannot read the BMC {what} from {path}: {exc.strerror}", kind="config") from exc
    return value.removesuffix("\n").removesuffix("\r")


def load_credentials(
    *,
    username: str | None = None,
    password_file: str | None = None,
    credentials_dir: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Credentials | None:
    """The credentials to log in with; None when none are configured anywhere (anonymous reads).

    BmcError(kind="config") when a configured file cannot be read or only half a pair is found.
    """
    secret = Path(credentials_dir) if credentials_dir else None
    if secret is not None and not secret.is_dir():
        raise BmcError(f"BMC credentials directory {secret} does not exist", kind="config")
    user = username
    if not user and secret is not None and (secret / "username").exists():
        user = _read_secret(secret / "username", "username")
    user = user or environ.get(ENV_USERNAME) or None
    password: str | None = None
    if password_file:
        path = Path(password_file)
        password = _read_secret(path, "password")
        _warn_if_world_readable(path)
    elif secret is not None and (secret / "password").exists():
        password = _read_secret(secret / "password", "password")
    else:
        password = environ.get(ENV_PASSWORD) or None  # set but empty: not given
    if user is None and password is None:
        return None
    if user is None:
        raise BmcError(
            f"a BMC password was given but no username (bmc.username or ${ENV_USERNAME})", kind="config"
        )
    if password is None:
        raise BmcError(
            f"BMC username {user!r} has no password: set bmc.password_file, bmc.credentials_dir "
            f"(a mounted secret with a `password` file) or ${ENV_PASSWORD}",
            kind="config",
        )
    return Credentials(user, password)


def _warn_if_world_readable(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & stat.S_IROTH:
        log.warning("BMC password file %s is readable by every user; chmod o-r it", path)
