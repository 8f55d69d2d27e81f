"""A small HTTP(S) server on loopback standing in for the outside world, and a test CA."""

from __future__ import annotations

import base64
import datetime
import hashlib
import io
import ssl
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


class Handler(BaseHTTPRequestHandler):
    server: Upstream

    def do_GET(self) -> None:
        self.server.heads.append(str(self.headers))
        url = urlsplit(self.path)
        if url.path in self.server.redirects:
            self.send_response(302)
            self.send_header("Location", self.server.redirects[url.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if url.path in self.server.files:
            body = self.server.files[url.path]
        elif url.path == "/big":
            body = b"x" * int(parse_qs(url.query)["n"][0])
        else:
            body = f"hello from upstream {self.path} host={self.headers['Host']}\n".encode()
        self.send_response(200)
        kind = "text/html" if url.path.endswith("/") else "application/octet-stream"
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.server.heads.append(str(self.headers))
        data = self.rfile.read(int(self.headers["Content-Length"]))
        body = f"posted {len(data)} bytes: {data[:20]!r}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Upstream(ThreadingHTTPServer):
    """Counts the connections it accepts, so a test can assert that none was made."""

    daemon_threads = True

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.context = context
        self.connections = 0
        self.heads: list[str] = []
        self.files: dict[str, bytes] = {}
        self.redirects: dict[str, str] = {}  # path -> Location of a 302
        self.thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def get_request(self):  # type: ignore[no-untyped-def]
        sock, addr = super().get_request()
        self.connections += 1
        if self.context is not None:
            sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def __enter__(self) -> Upstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


def make_wheel(
    name: str, version: str, source: str, requires: tuple[str, ...] = ()
) -> tuple[str, bytes]:
    """A pure-Python wheel with one module, built by hand: (file name, bytes)."""
    files = {
        f"{name}/__init__.py": source.encode(),
        f"{name}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        ).encode(),
        f"{name}-{version}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: sandbank-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = f"{name}-{version}.dist-info/RECORD"
    lines = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(data)}")
    lines.append(f"{record},,")
    files[record] = ("\n".join(lines) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


def serve_index(upstream: Upstream, name: str, wheel: tuple[str, bytes]) -> None:
    """One project of a PEP 503 simple index at /simple/ (no other project is found there)."""
    file_name, data = wheel
    sha = hashlib.sha256(data).hexdigest()
    upstream.files[f"/simple/{name}/"] = (
        f'<html><body><a href="/files/{file_name}#sha256={sha}">{file_name}</a></body></html>'
    ).encode()
    upstream.files[f"/files/{file_name}"] = data


def make_ca(directory: Path, names: list[str]) -> tuple[Path, ssl.SSLContext]:
    """A throwaway CA (its certificate written to directory/ca.pem) and a server context."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbank test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(pem))
    chain = directory / "server.pem"
    chain.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + cert.public_bytes(pem)
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(chain)
    return ca_file, ctx
