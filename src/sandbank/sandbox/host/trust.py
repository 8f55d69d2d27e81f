"""Every sandbox's trust store: Debian's CA bundle and the operator's CAs, assembled at start.

`prepare` is the one place the bundle is made: the system's `/etc/ssl/certs/ca-certificates.crt`
(package ca-certificates), then the certificates of `SANDBANK_EXTRA_CA_FILE` (a corporate
proxy's, a private index's), then any `extra` a caller adds (the deployment CA of secretless
credentials). It lands on a read-only tmpfs of its own, one per content and machine-wide
(`/run/sandbank/trust/<key>`), which both backends bind read-only at `/etc/ssl/certs`: the
sandbox's mountinfo names no host path, and each sandbox costs nothing more. Inside, the usual
path and the variables below agree, so curl, wget, git, urllib, requests, httpx, aiohttp and pip
all verify against it (and certifi's bundle is this file: scripts/seal-runtime).
"""

from __future__ import annotations

import hashlib
import logging
import re
import ssl
from collections.abc import Sequence
from pathlib import Path

from ...config import Settings
from ...errors import ConfigError
from . import image

log = logging.getLogger(__name__)

SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CERTS_INSIDE = "/etc/ssl/certs"
BUNDLE_NAME = "ca-certificates.crt"
BUNDLE_INSIDE = f"{CERTS_INSIDE}/{BUNDLE_NAME}"
MOUNTS = Path("/run/sandbank/trust")
PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.S)


def sandbox_env(store: Path | None) -> dict[str, str]:
    """The variables that point each client at the store (what reads none uses the path)."""
    if store is None:
        return {}
    return {
        "SSL_CERT_FILE": BUNDLE_INSIDE,  # OpenSSL: urllib, aiohttp, httpx, wget's fallback
        "REQUESTS_CA_BUNDLE": BUNDLE_INSIDE,
        "CURL_CA_BUNDLE": BUNDLE_INSIDE,
        "PIP_CERT": BUNDLE_INSIDE,
    }


def binds(store: Path | None) -> list[tuple[str, str]]:
    """(host path, sandbox path) read-only binds: the store's mount at /etc/ssl/certs."""
    return [] if store is None else [(str(store), CERTS_INSIDE)]


def assemble(settings: Settings, extra: Sequence[bytes] = ()) -> bytes:
    """The bundle: the system's certificates, the operator's, then `extra` (PEM each)."""
    parts = []
    if SYSTEM_BUNDLE.exists():
        parts.append(SYSTEM_BUNDLE.read_bytes())
    else:
        log.warning(
            "no system CA bundle at %s (`apt-get install ca-certificates`): sandboxes trust "
            "only the operator's CAs",
            SYSTEM_BUNDLE,
        )
    if settings.extra_ca_file is not None:
        parts.append(_operator_certificates(settings.extra_ca_file))
    parts += extra
    return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in parts)


def _operator_certificates(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"SANDBANK_EXTRA_CA_FILE={path} cannot be read: {e.strerror}") from None
    found = PEM.findall(data)
    if not found:
        raise ConfigError(
            f"SANDBANK_EXTRA_CA_FILE={path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )
    pem = b"\n".join(found) + b"\n"
    try:
        ssl.create_default_context(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(
            f"SANDBANK_EXTRA_CA_FILE={path} holds a certificate OpenSSL rejects: {e}"
        ) from None
    return f"# SANDBANK_EXTRA_CA_FILE ({len(found)} certificate(s))\n".encode() + pem


def prepare(settings: Settings, extra: Sequence[bytes] = ()) -> Path | None:
    """Assemble the bundle and mount it; the directory sandboxes bind (None: nothing to trust)."""
    bundle = assemble(settings, extra)
    if not bundle.strip():
        return None
    return mounted(bundle)


def mounted(bundle: bytes) -> Path:
    """The bundle on a read-only tmpfs of its own, one per content, machine-wide."""
    key = hashlib.sha256(bundle).hexdigest()[:16]
    size = len(bundle) + (64 << 10)
    return image.mounted_files(
        MOUNTS, key, {BUNDLE_NAME: bundle}, size, "the sandboxes' trust store"
    )
