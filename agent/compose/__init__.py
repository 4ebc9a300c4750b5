"""The agent's composition root: where the agent is wired from its config. sources.py (the GPU
source, host and probe runner), probes.py (real probes where torch sees CUDA), bmc.py (Redfish or
the simulator's BMC) and metrics.py (/metrics); agent/cli.py calls them, and the daemon adds the
collectors and command handlers that their registries hold. A new subsystem plugs in here."""
