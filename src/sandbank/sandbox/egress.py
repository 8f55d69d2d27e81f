"""The operator's egress settings for sandboxes, read once: the policies, the credentials and
the proxy."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Settings
from ..egress.credentials import (
    Applicable,
    Chain,
    CredentialError,
    CredentialSet,
    Listed,
    load_operator_file,
)
from ..egress.limits import EgressLimits
from ..egress.policy import NetworkPolicy
from ..egress.proxy import EgressProxy
from ..egress.pump import Pump
from ..egress.resolver import FixedResolver, Resolver, SystemResolver
from ..egress.sealing import Sealer
from ..egress.vault import FILE_NAME, Vault
from ..errors import ConfigError


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
    return EgressProxy(
        config.default.union(config.ceiling),
        limits,
        resolver,
        data_dir=settings.data_dir,
        extra_ca_file=settings.extra_ca_file,
        pump=Pump(limits.rate_bytes, limits.idle_seconds),
    )


class CredentialBook:
    """The credentials this server's sessions may get, besides their own: the operator's file
    and, with a key to seal them, what tenants store (`vault`)."""

    def __init__(self, settings: Settings) -> None:
        self.file = settings.egress_credentials_file
        self.operator = Listed(())
        sealer = Sealer.from_setting(settings.credentials_key.get_secret_value())
        path = settings.data_dir / "egress" / FILE_NAME
        self.vault: Vault | None = Vault(path, sealer) if sealer is not None else None

    def load(self) -> None:
        """At start: the operator's file (`ConfigError` naming what is wrong), the vault."""
        if self.file is not None:
            try:
                self.operator = Listed(load_operator_file(self.file))
            except CredentialError as e:
                raise ConfigError(f"SANDBANK_EGRESS_CREDENTIALS_FILE: {e}") from None
        if self.vault is not None:
            try:
                self.vault.load()
            except CredentialError as e:
                raise ConfigError(str(e)) from None

    def chain(self, tenant: str, own: CredentialSet) -> Applicable:
        """A session's credentials: its own first, then its tenant's, then the operator's."""
        links: list[Applicable] = [own]
        if self.vault is not None:
            links.append(self.vault.of(tenant))
        links.append(self.operator)
        return Chain(*links)
