"""The operator's egress settings for sandboxes, read once: the policies and the proxy."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Settings
from ..egress.limits import EgressLimits
from ..egress.policy import NetworkPolicy
from ..egress.proxy import EgressProxy
from ..egress.resolver import FixedResolver, Resolver, SystemResolver


@dataclass(frozen=True)
class EgressConfig:
    default: NetworkPolicy  # what a session gets when it asks for nothing
    ceiling: NetworkPolicy  # the most a client may ask for

    @classmethod
    def from_settings(cls, settings: Settings) -> EgressConfig:
        default = NetworkPolicy.from_setting(settings.egress_allow)
        ceiling = (
            NetworkPolicy.from_setting(settings.egress_allow_max)
            if settings.egress_allow_max.strip()
            else default
        )
        return cls(default, ceiling)

    @property
    def enabled(self) -> bool:
        """Whether any session can have a network: only then do sandboxes get a proxy."""
        return not (self.default.is_none and self.ceiling.is_none)

    def effective(self, requested: NetworkPolicy | None) -> NetworkPolicy:
        """A session's policy: the operator's default, or the client's hint clamped."""
        if requested is None:
            return self.default
        return requested.clamp(self.ceiling)


def build_proxy(settings: Settings, config: EgressConfig) -> EgressProxy | None:
    if not config.enabled:
        return None
    resolver: Resolver = (
        FixedResolver.parse(settings.egress_test_hosts)
        if settings.egress_test_hosts.strip()
        else SystemResolver()
    )
    limits = EgressLimits(
        connections_per_session=settings.egress_connections_per_session,
        bytes_per_session=settings.egress_bytes_per_session,
        rate_bytes=settings.egress_rate_bytes,
    )
    return EgressProxy(config.default.union(config.ceiling), limits, resolver)
