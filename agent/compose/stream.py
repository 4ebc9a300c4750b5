"""The stream's transport security from the agent's config: mutual TLS files, or plaintext."""

from __future__ import annotations

import logging

from agent.config import StreamConfig
from protos.transport import ClientTls

log = logging.getLogger("gpufleet.agent.stream")


def client_tls(config: StreamConfig) -> ClientTls | None:
    """The TLS files to reach the controller with (read at each connection); None: plaintext, which
    the config allowed (a loopback controller, or stream.insecure) and which is said here, once."""
    if config.tls_ca is not None:
        return ClientTls(config.tls_ca, config.tls_cert, config.tls_key)
    if config.controller is not None:
        log.warning(
            "plaintext stream to controller %s%s: not encrypted, and the controller cannot tell this "
            "node from any other (give --tls-ca, --tls-cert and --tls-key for mutual TLS)",
            config.controller,
            " (--insecure)" if config.insecure else "",
        )
    return None
