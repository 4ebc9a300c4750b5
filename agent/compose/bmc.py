"""The node's BMC source from the agent config: Redfish when a URL is configured, else (with the
simulated GPU source) the simulator's BMC. Imports stay inside so an agent without a BMC never
loads the Redfish library."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.config import AgentConfig, BmcConfig

if TYPE_CHECKING:
    from agent.sources.bmc import BmcSource
    from agent.sources.gpu import GpuSource
    from agent.sources.redfish.session import BmcEndpoint


def endpoint(cfg: BmcConfig, url: str) -> BmcEndpoint:
    """The endpoint for `url` with credentials resolved now; BmcError(kind="config") if they can't be."""
    from urllib.parse import urlsplit

    from agent.sources.redfish.credentials import load_credentials
    from agent.sources.redfish.session import BmcEndpoint, BmcError

    if "@" in urlsplit(url).netloc:
        # requests would log in with them, and the URL is the BMC's label in logs, metrics and
        # the controller: the password would be everywhere. The URL is not echoed here either.
        raise BmcError(
            "the BMC URL must not hold credentials (user:password@): give bmc.username and "
            "bmc.password_file, bmc.credentials_dir or $GPUFLEET_BMC_PASSWORD",
            kind="config",
        )
    credentials = load_credentials(
        username=cfg.username, password_file=cfg.password_file, credentials_dir=cfg.credentials_dir
    )
    return BmcEndpoint(
        url,
        credentials,
        ca_bundle=cfg.ca_bundle,
        insecure=cfg.insecure,
        connect_timeout_seconds=cfg.connect_timeout_seconds,
        read_timeout_seconds=cfg.read_timeout_seconds,
    )


def build_bmc(config: AgentConfig, gpu: GpuSource) -> BmcSource | None:
    cfg = config.bmc
    if cfg.url:
        from agent.sources.redfish.bmc import RedfishBmc

        return RedfishBmc(
            endpoint(cfg, cfg.url),
            log_entries=cfg.log_entries,
            inventory_every=cfg.inventory_every_polls,
            poll_timeout_seconds=cfg.poll_timeout_seconds,
        )
    if config.source == "sim" and cfg.simulated:
        from agent.sources.sim import SimNode
        from agent.sources.sim.bmc import SimBmc

        if isinstance(gpu, SimNode):
            return SimBmc(gpu, seed=config.sim.seed)
    return None
