"""Credentials bound to destinations: what the proxy adds to a session's requests, outside it.

A credential is a destination (`NAME:PORT`, or `*.SUFFIX:PORT` for the names under a suffix)
and what to add to each request to it: headers (`Authorization: Bearer ...`), a basic-auth pair
(sent as `Authorization: Basic ...`) or a query parameter. It comes from the operator's file
(`SANDBANK_EGRESS_CREDENTIALS_FILE`, TOML), a tenant's or a user's stored set, or a session's
own. It never widens a policy: the proxy looks for one only once the destination has passed
the session's. Its values are never listed, logged or put in a message: it is named by its id.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import quote, quote_plus

from .policy import normalize_name

Kind = Literal["headers", "basic", "query"]
Scope = Literal["operator", "tenant", "user", "session"]
KINDS: tuple[Kind, ...] = ("headers", "basic", "query")
MAX_HEADERS = 16
MAX_VALUE_CHARS = 8192
MAX_NAME_CHARS = 200
MAX_PER_SESSION = 32
MAX_PER_OWNER = 100
MAX_ID_CHARS = 64
# A secret shorter than this is not looked for in answers (it would match innocent text).
MIN_SCRUBBED = 8
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_QUERY_NAME = re.compile(r"^[A-Za-z0-9._~-]+$")
# Headers that frame or route a request: a credential that set them could smuggle another
# request or send it elsewhere.
FRAMING = frozenset(
    {
        "host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
        "trailer", "upgrade", "expect", "proxy-authorization", "proxy-authenticate",
        "proxy-connection",
    }
)  # fmt: skip


class CredentialError(ValueError):
    """A credential that does not parse; the message never holds a secret value."""


def new_id() -> str:
    return "cred_" + secrets.token_hex(8)


@dataclass(frozen=True)
class Destination:
    """Where a credential applies: one name and port, or the names under a suffix."""

    name: str
    wildcard: bool
    port: int

    @classmethod
    def parse(cls, text: Any) -> Destination:
        if not isinstance(text, str) or len(text) > 300:
            raise CredentialError("destination must be a string NAME:PORT")
        host, sep, port = text.strip().rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise CredentialError(
                f"destination {text!r}: expected NAME:PORT (PORT a number: api.example.com:443)"
            )
        wildcard = host.startswith("*.")
        name = normalize_name(host[2:] if wildcard else host)
        if name is None:
            raise CredentialError(
                f"destination {text!r}: not a host name or `*.suffix` pattern (credentials "
                "bind to names, never to addresses)"
            )
        return cls(name, wildcard, int(port))

    def matches(self, name: str, port: int) -> bool:
        if port != self.port:
            return False
        return name.endswith("." + self.name) if self.wildcard else name == self.name

    @property
    def rank(self) -> tuple[int, int]:
        """Lower is more specific: an exact name, then the longest suffix."""
        return (1 if self.wildcard else 0, -len(self.name))

    def __str__(self) -> str:
        return f"{'*.' if self.wildcard else ''}{self.name}:{self.port}"


@dataclass(frozen=True)
class Secret:
    """What is added to a request. Never printed: its repr hides it."""

    headers: tuple[tuple[str, str], ...] = ()
    query: tuple[str, str] | None = None

    def __repr__(self) -> str:
        return "Secret(<hidden>)"

    def markers(self) -> list[bytes]:
        """The forms in which it could come back in an answer's headers (to remove it)."""
        found: set[str] = set()
        for name, value in self.headers:
            found.add(value)
            _, _, token = value.partition(" ")
            if name.lower() == "authorization" and token:
                found.add(token.strip())
        if self.query is not None:
            value = self.query[1]
            found |= {value, quote(value, safe=""), quote_plus(value)}
        return sorted(
            (m.encode("latin-1") for m in found if len(m) >= MIN_SCRUBBED), key=len, reverse=True
        )

    def to_bytes(self) -> bytes:
        return json.dumps({"headers": self.headers, "query": self.query}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Secret:
        raw = json.loads(data)
        query = raw.get("query")
        return cls(
            headers=tuple((str(n), str(v)) for n, v in raw.get("headers") or ()),
            query=(str(query[0]), str(query[1])) if query else None,
        )


@dataclass(frozen=True)
class CredentialInfo:
    """A credential as it is listed: everything but its values."""

    id: str
    destination: str
    kind: Kind
    names: tuple[str, ...]  # the header names it sets, or its query parameter's name
    scope: Scope
    created_at: float

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "id": self.id,
            "destination": self.destination,
            "kind": self.kind,
            "scope": self.scope,
            "created_at": self.created_at,
        }
        if self.kind == "query":
            shown["query"] = self.names[0] if self.names else ""
        else:
            shown["headers"] = list(self.names)
        return shown

    @classmethod
    def from_json(cls, data: Any) -> CredentialInfo:
        kind = data["kind"]
        names = [data["query"]] if kind == "query" else list(data.get("headers") or [])
        scope = data.get("scope", "session")
        if kind not in KINDS or scope not in ("operator", "tenant", "user", "session"):
            raise ValueError("not a credential's listing")
        return cls(
            id=str(data["id"]),
            destination=str(data["destination"]),
            kind=kind,
            names=tuple(str(n) for n in names),
            scope=scope,
            created_at=float(data.get("created_at") or 0.0),
        )


@dataclass(frozen=True)
class Credential:
    """A destination and what the proxy adds to each request to it."""

    id: str
    destination: Destination
    kind: Kind
    names: tuple[str, ...]
    secret: Secret = field(repr=False, compare=False)
    scope: Scope = "session"
    created_at: float = 0.0

    def info(self) -> CredentialInfo:
        return CredentialInfo(
            self.id, str(self.destination), self.kind, self.names, self.scope, self.created_at
        )

    def to_request(self) -> dict[str, Any]:
        """The credential as a client sends it (its values included: for a sandbox server)."""
        body: dict[str, Any] = {"id": self.id, "destination": str(self.destination)}
        if self.kind == "query":
            assert self.secret.query is not None
            body["query"] = {"name": self.secret.query[0], "value": self.secret.query[1]}
        else:  # a basic pair travels as the header it became
            body["headers"] = dict(self.secret.headers)
        return body


def parse_credential(
    data: Any,
    scope: Scope,
    *,
    where: str = "",
    credential_id: str | None = None,
    accept_id: bool = False,
    now: float | None = None,
) -> Credential:
    """One credential from its JSON/TOML object; `CredentialError` naming the field.

    `{"destination": "NAME:PORT"}` and exactly one of `"headers": {NAME: VALUE}`,
    `"basic": {"username": U, "password": P}` or `"query": {"name": N, "value": V}`; `"id"`
    only where `accept_id` (the operator's file, a server passing a session's credentials on).
    """
    subject = where.rstrip(".: ") or "a credential"
    if not isinstance(data, Mapping):
        raise CredentialError(f"{subject} must be an object")
    allowed = {"destination", *KINDS} | ({"id"} if accept_id else set())
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise CredentialError(
            f"{subject}: {unknown[0][:40]!r} is not a field of a credential (fields: "
            f"{', '.join(sorted(allowed))})"
        )
    try:
        destination = Destination.parse(data.get("destination"))
    except CredentialError as e:
        raise CredentialError(f"{where}{e}") from None
    given = [k for k in KINDS if k in data]
    if len(given) != 1:
        raise CredentialError(f"{subject} needs exactly one of `headers`, `basic` or `query`")
    kind: Kind = given[0]
    if kind == "headers":
        secret = Secret(headers=_headers(data["headers"], f"{where}headers"))
        names = tuple(n for n, _ in secret.headers)
    elif kind == "basic":
        secret = Secret(headers=(("Authorization", _basic(data["basic"], f"{where}basic")),))
        names = ("Authorization",)
    else:
        secret = Secret(query=_query(data["query"], f"{where}query"))
        names = (secret.query[0],) if secret.query else ()
    if accept_id and "id" in data:
        credential_id = _identifier(data["id"], f"{where}id")
    return Credential(
        id=credential_id or new_id(),
        destination=destination,
        kind=kind,
        names=names,
        secret=secret,
        scope=scope,
        created_at=time.time() if now is None else now,
    )


def parse_credentials(
    data: Any, scope: Scope, *, where: str = "credentials", accept_id: bool = False
) -> tuple[Credential, ...]:
    """A list of credentials (at most MAX_PER_SESSION), ids unique."""
    if not isinstance(data, list):
        raise CredentialError(f"{where} must be a list of credentials")
    if len(data) > MAX_PER_SESSION:
        raise CredentialError(f"{where} has more than {MAX_PER_SESSION} credentials")
    found = tuple(
        parse_credential(item, scope, where=f"{where}[{i}].", accept_id=accept_id)
        for i, item in enumerate(data)
    )
    ids = [c.id for c in found]
    if len(set(ids)) != len(ids):
        raise CredentialError(f"{where}: two credentials have the same id")
    return found


def _text(value: Any, where: str, limit: int = MAX_VALUE_CHARS) -> str:
    """Printable ASCII (what a header may carry unambiguously), never echoed."""
    if not isinstance(value, str) or not value:
        raise CredentialError(f"{where} must be a non-empty string")
    if len(value) > limit:
        raise CredentialError(f"{where} is longer than {limit} characters")
    if not all(" " <= c <= "~" or c == "\t" for c in value):
        raise CredentialError(
            f"{where} must be printable ASCII (no line breaks or control characters)"
        )
    return value


def _headers(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping) or not value:
        raise CredentialError(f"{where} must be an object of header names and values")
    if len(value) > MAX_HEADERS:
        raise CredentialError(f"{where} has more than {MAX_HEADERS} headers")
    seen: set[str] = set()
    found = []
    for name, text in value.items():
        if not isinstance(name, str) or not _TOKEN.match(name) or len(name) > MAX_NAME_CHARS:
            raise CredentialError(f"{where}: {str(name)[:40]!r} is not a header name")
        lowered = name.lower()
        if lowered in FRAMING or lowered.startswith("proxy-"):
            raise CredentialError(f"{where}: {name} frames or routes the request: not settable")
        if lowered in seen:
            raise CredentialError(f"{where}: {name} is given twice")
        seen.add(lowered)
        found.append((name, _text(text, f"{where}.{name}").strip()))
    return tuple(found)


def _basic(value: Any, where: str) -> str:
    if not isinstance(value, Mapping) or set(value) != {"username", "password"}:
        raise CredentialError(f"{where} must be {{username, password}}")
    user = _text(value["username"], f"{where}.username", MAX_NAME_CHARS)
    if ":" in user:
        raise CredentialError(f"{where}.username must not contain ':'")
    password = _text(value["password"], f"{where}.password")
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def _query(value: Any, where: str) -> tuple[str, str]:
    if not isinstance(value, Mapping) or set(value) != {"name", "value"}:
        raise CredentialError(f"{where} must be {{name, value}}")
    name = value["name"]
    if not isinstance(name, str) or not _QUERY_NAME.match(name) or len(name) > MAX_NAME_CHARS:
        raise CredentialError(f"{where}.name must be letters, digits and ._~-")
    return name, _text(value["value"], f"{where}.value")


def _identifier(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _ID.match(value) or len(value) > MAX_ID_CHARS:
        raise CredentialError(
            f"{where} must be letters, digits and ._- (at most {MAX_ID_CHARS} characters)"
        )
    return value


def best(credentials: Iterable[Credential], name: str, port: int) -> Credential | None:
    """The most specific credential for a destination (the first of equals), or None."""
    found: Credential | None = None
    for c in credentials:
        if c.destination.matches(name, port) and (
            found is None or c.destination.rank < found.destination.rank
        ):
            found = c
    return found


class Applicable(Protocol):
    """The credentials that apply to one session's requests."""

    def find(self, name: str, port: int) -> Credential | None:
        """The credential for a request to `name:port` (already allowed by the policy)."""
        ...

    def listed(self) -> list[Credential]:
        """Every credential that could apply (for the session's own view of its policy)."""
        ...


class NoCredentials:
    """A session to which nothing is added."""

    def find(self, name: str, port: int) -> Credential | None:
        return None

    def listed(self) -> list[Credential]:
        return []


class CredentialSet:
    """A session's own credentials, by id; changed while the session lives."""

    def __init__(self, items: Iterable[Credential] = ()) -> None:
        self._items = {c.id: c for c in items}

    def find(self, name: str, port: int) -> Credential | None:
        return best(self._items.values(), name, port)

    def listed(self) -> list[Credential]:
        return list(self._items.values())

    def remove(self, credential_id: str) -> bool:
        return self._items.pop(credential_id, None) is not None

    def replace(self, items: Iterable[Credential]) -> None:
        self._items = {c.id: c for c in items}

    def __len__(self) -> int:
        return len(self._items)


class Chain:
    """The credentials of one session in order: its own, its tenant's, the operator's. The
    first of these with a credential for the destination decides (its most specific one)."""

    def __init__(self, *links: Applicable) -> None:
        self.links = links

    def find(self, name: str, port: int) -> Credential | None:
        for link in self.links:
            found = link.find(name, port)
            if found is not None:
                return found
        return None

    def listed(self) -> list[Credential]:
        return [c for link in self.links for c in link.listed()]


def load_operator_file(path: Path) -> tuple[Credential, ...]:
    """The operator's credentials: a TOML file of `[[credential]]` tables; `CredentialError`
    naming the entry and field (never a value)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise CredentialError(f"{path} cannot be read: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise CredentialError(f"{path} is not TOML: {e}") from None
    extra = sorted(set(data) - {"credential"})
    if extra:
        raise CredentialError(f"{path}: unknown table {extra[0]!r} (use [[credential]])")
    entries = data.get("credential", [])
    if not isinstance(entries, list):
        raise CredentialError(f"{path}: `credential` must be an array of tables ([[credential]])")
    found: list[Credential] = []
    for i, entry in enumerate(entries):
        found.append(
            parse_credential(
                entry,
                "operator",
                where=f"{path}, credential #{i + 1}: ",
                credential_id=f"operator-{i + 1}",
                accept_id=True,
            )
        )
    ids = [c.id for c in found]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise CredentialError(f"{path}: the id {duplicated[0]!r} is given twice")
    return tuple(found)


class Listed:
    """A fixed list (the operator's), matched most specific first."""

    def __init__(self, items: Sequence[Credential]) -> None:
        self.items = tuple(items)

    def find(self, name: str, port: int) -> Credential | None:
        return best(self.items, name, port)

    def listed(self) -> list[Credential]:
        return list(self.items)
