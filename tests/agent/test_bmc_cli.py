"""`gpufleet bmc` and the BMC endpoint the agent builds: what is refused before any request."""

from __future__ import annotations

import pytest

from agent import bmc_cli
from agent.compose.bmc import endpoint
from agent.config import BmcConfig
from agent.sources.redfish.session import BmcError


def test_a_url_holding_credentials_is_refused_without_echoing_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # requests would log in with them, and the URL labels the BMC in logs, metrics and the controller.
    url = "https://admin:hunter2@127.0.0.1:1"
    with pytest.raises(BmcError) as caught:
        endpoint(BmcConfig(url=url), url)
    assert caught.value.kind == "config" and "hunter2" not in str(caught.value)
    assert bmc_cli.main(["--url", url]) == 2
    err = capsys.readouterr().err
    assert "must not hold credentials" in err and "hunter2" not in err


def test_a_read_timeout_that_is_not_a_finite_number_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Before, `--timeout nan` passed the `> 0` check and the read gave up 'within nan s'."""
    assert bmc_cli.main(["--url", "http://127.0.0.1:1", "--timeout", "nan"]) == 2
    assert capsys.readouterr().err == "gpufleet bmc: --timeout must be a finite number of seconds, not nan\n"
