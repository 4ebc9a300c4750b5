"""The one line that tells operators the controller's own security is weakened."""

from __future__ import annotations

from controller.config import ControllerConfig


def security_warning(config: ControllerConfig) -> str:
    """ "" when gRPC is TLS and operators need tokens; else one line naming each weakness."""
    weak = []
    if config.plaintext:
        weak.append("plaintext gRPC: anyone who can reach the controller can speak as any node")
    if config.operator_tokens is None:
        weak.append("operator API without tokens: anyone who can reach it can act as an operator")
    return "; ".join(weak)
