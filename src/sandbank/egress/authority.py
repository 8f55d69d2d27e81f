"""The deployment's CA: what lets the proxy see, and add to, a request to a destination with a
credential, and the leaf certificates it mints for those destinations.

Made at the first start with egress on, in `<data>/egress/ca/` (directory 0700, key 0600, both
the server's: root's), and kept: every sandbox's trust store holds its certificate
(`host/trust.py`). Only sandboxes trust it, and the proxy presents its leaves only on connections
it terminates: those to a destination that has a credential. A leaf is minted per name, with a
key made at start (kept in memory only), cached while it is fresh, and loaded into its TLS
context from a memory file, never from disk.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import os
import ssl
import threading
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger(__name__)

CA_DIR = "egress/ca"
CERT_FILE = "ca.pem"
KEY_FILE = "ca.key"
CA_YEARS = 10
RENEW_BEFORE = datetime.timedelta(days=30)  # a CA this close to its end is replaced at start
LEAF_LIFETIME = datetime.timedelta(days=7)
LEAF_RENEW = datetime.timedelta(days=1)  # a cached leaf older than this is minted again
LEAVES = 512  # names whose TLS contexts are kept


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Authority:
    """The CA's certificate and key, and the leaves' TLS contexts by name."""

    def __init__(self, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.certificate = certificate
        self._key = key
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_pem = self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        self._contexts: OrderedDict[str, tuple[ssl.SSLContext, datetime.datetime]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @classmethod
    def load_or_create(cls, data_dir: Path) -> Authority:
        """The data directory's CA, made (and written, key 0600) when there is none usable."""
        directory = data_dir / CA_DIR
        directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
        cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
        try:
            os.chmod(key_path, 0o600)  # whatever it was, the key is the server's alone
            os.chown(key_path, os.geteuid(), os.getegid())
            certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except FileNotFoundError:
            pass
        except ValueError as e:
            log.warning("the egress CA in %s does not load (%s): a new one is made", directory, e)
        else:
            if (
                isinstance(key, ec.EllipticCurvePrivateKey)
                and key.public_key() == certificate.public_key()
                and certificate.not_valid_after_utc - _now() > RENEW_BEFORE
            ):
                return cls(certificate, key)
            log.warning(
                "the egress CA in %s is expiring or mismatched: a new one is made", directory
            )
        authority = cls.create(data_dir)
        key_bytes = authority._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write(key_path, key_bytes, 0o600)
        _write(cert_path, authority.certificate_pem, 0o644)
        log.info("made the deployment's egress CA in %s (sandboxes trust it)", directory)
        return authority

    @classmethod
    def create(cls, data_dir: Path) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        tag = hashlib.sha256(str(data_dir.resolve()).encode() + os.urandom(8)).hexdigest()[:8]
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sandbank"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"Sandbank egress CA {tag}"),
            ]
        )
        now = _now()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=365 * CA_YEARS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(key_cert_sign=True, crl_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(certificate, key)

    def context_for(self, name: str) -> ssl.SSLContext:
        """A server-side TLS context presenting a leaf for `name` (minted, or cached)."""
        now = _now()
        with self._lock:
            cached = self._contexts.get(name)
            if cached is not None and now - cached[1] < LEAF_RENEW:
                self._contexts.move_to_end(name)
                return cached[0]
        context = self._mint(name, now)
        with self._lock:
            self._contexts[name] = (context, now)
            self._contexts.move_to_end(name)
            while len(self._contexts) > LEAVES:
                self._contexts.popitem(last=False)
        return context

    def _mint(self, name: str, now: datetime.datetime) -> ssl.SSLContext:
        public = self._leaf_key.public_key()
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
            .issuer_name(self.certificate.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(min(now + LEAF_LIFETIME, self.certificate.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(digital_signature=True), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
            .sign(self._key, hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])  # the proxy reads HTTP/1.1 only
        # A memory file: the leaf's key never touches a disk.
        fd = os.memfd_create("sandbank-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, leaf.public_bytes(serialization.Encoding.PEM) + self._leaf_pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return context


def upstream_context(extra_ca_file: Path | None) -> ssl.SSLContext:
    """How the proxy verifies the real destination: the system's CAs and the operator's
    (`SANDBANK_EXTRA_CA_FILE`), exactly what a sandbox would have trusted end to end; never
    the deployment's own CA."""
    context = ssl.create_default_context()
    if extra_ca_file is not None:
        context.load_verify_locations(cafile=str(extra_ca_file))
    context.set_alpn_protocols(["http/1.1"])
    return context


def _usage(**allowed: bool) -> x509.KeyUsage:
    """A KeyUsage allowing only what is named."""
    names = (
        "digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
        "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only",
    )  # fmt: skip
    return x509.KeyUsage(**{n: allowed.get(n, False) for n in names})


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
