"""The HTTP helpers both APIs share (sandbank/http), in-process: bearer credentials and tokens as
tenants, the Host allow-list, trusted proxies, Server-Sent Events, headers for untrusted files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from sandbank.config import Settings
from sandbank.errors import BadRequest, PathEscape, Unauthorized
from sandbank.files.base import check_key, content_disposition, object_key
from sandbank.http.auth import TokenAuth, bearer, load_tokens
from sandbank.http.hosts import HostAllowList
from sandbank.http.proxies import is_trusted, parse_networks
from sandbank.http.responses import sse, untrusted_file_headers


@pytest.mark.parametrize(
    ("header", "credential"),
    [
        ("Bearer abc", "abc"),
        ("bearer   abc  ", "abc"),
        ("BEARER abc", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer    ", None),
        ("", None),
        (None, None),
    ],
)
def test_a_bearer_credential_is_read_from_its_scheme_only(
    header: str | None, credential: str | None
) -> None:
    assert bearer(header) == credential


def test_each_token_is_a_tenant_of_its_own_that_does_not_reveal_it() -> None:
    auth = TokenAuth(["tok-a", "tok-b"])
    a, b = auth.tenant("Bearer tok-a"), auth.tenant("Bearer tok-b")
    assert a != b and len(a) == 24 and "tok-a" not in a
    assert auth.tenant("Bearer tok-a") == a  # stable
    with pytest.raises(Unauthorized, match="required"):
        auth.tenant(None)
    with pytest.raises(Unauthorized, match="not accepted"):
        auth.tenant("Bearer tok-c")
    assert TokenAuth([]).tenant(None) == "" and not TokenAuth([]).enabled


def test_a_tenant_id_is_the_same_from_release_to_release_among_thousands_of_tokens() -> None:
    """Sessions, files and runs are kept under the tenant id: it must never change."""
    tokens = [f"tenant-token-{i:05d}" for i in range(5000)]
    auth = TokenAuth(tokens)
    for token in (tokens[0], tokens[2500], tokens[-1]):
        expected = hashlib.sha256(token.encode()).hexdigest()[:24]
        assert auth.tenant(f"Bearer {token}") == expected
    assert len({auth.tenant(f"Bearer {t}") for t in tokens[:500]}) == 500
    for wrong in ("tenant-token-5000", "tenant-token-0000", tokens[7][:-1], "x" + tokens[7]):
        with pytest.raises(Unauthorized, match="not accepted"):
            auth.tenant(f"Bearer {wrong}")


def test_tokens_come_from_the_setting_and_the_file_without_blanks_or_comments(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens"
    path.write_text("# the operator's note\nfile-token\n\n  spaced  \n")
    settings = Settings(exec_tokens=" one , ,two", exec_tokens_file=path)
    assert load_tokens(settings) == ["one", "two", "file-token", "spaced"]


def guarded(allowed: list[str]) -> TestClient:
    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[Route("/", ok)], middleware=[Middleware(HostAllowList, allowed=allowed)]
    )
    return TestClient(app)


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("localhost", 200),
        ("localhost:8080", 200),
        ("LOCALHOST:1", 200),
        ("127.0.0.1:9", 200),
        ("[::1]:8080", 200),
        ("[::1]", 200),
        ("evil.example", 421),
        ("localhost.evil.example", 421),
        ("", 421),
    ],
)
def test_the_host_allow_list_takes_names_with_or_without_a_port(host: str, status: int) -> None:
    r = guarded(["localhost", "127.0.0.1", "[::1]"]).get("/", headers={"Host": host})
    assert r.status_code == status
    if status == 421:
        assert "SANDBANK_ALLOWED_HOSTS" in r.json()["detail"]


def test_a_star_allows_any_host() -> None:
    assert guarded(["*"]).get("/", headers={"Host": "anything.example"}).status_code == 200


def test_only_peers_in_the_trusted_networks_are_believed() -> None:
    networks = parse_networks("127.0.0.1/32, 10.0.0.0/8,,fd00::/8")
    assert is_trusted("127.0.0.1", networks) and is_trusted("10.2.3.4", networks)
    assert is_trusted("fd00::1", networks)
    assert not is_trusted("127.0.0.2", networks)
    assert not is_trusted("testclient", networks)  # not an address
    assert not is_trusted(None, networks) and not is_trusted("127.0.0.1", [])


def test_an_event_is_its_id_name_and_one_line_of_json() -> None:
    frame = sse("message", {"text": "two\nlines"}, event_id="1.5")
    assert frame.endswith(b"\n\n") and frame.count(b"\n") == 4
    head, name, data = frame.decode().split("\n")[:3]
    assert (head, name) == ("id: 1.5", "event: message")
    assert json.loads(data.removeprefix("data: ")) == {"text": "two\nlines"}
    assert not sse("end", {}).startswith(b"id:")


@pytest.mark.parametrize(
    ("name", "kind"),
    [("a.png", "inline"), ("a.svg", "attachment"), ("a.html", "attachment"), ("a", "attachment")],
)
def test_only_raster_images_may_show_inline_and_nothing_runs(name: str, kind: str) -> None:
    headers = untrusted_file_headers(name, 10)
    assert headers["Content-Disposition"].startswith(kind)
    assert headers["Content-Security-Policy"].startswith("sandbox")
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Length"] == "10"


def test_a_hostile_name_cannot_break_the_header() -> None:
    disposition = untrusted_file_headers('a"\r\nSet-Cookie: x=1\\é.txt')["Content-Disposition"]
    assert "\r" not in disposition and "\n" not in disposition
    assert 'filename="a___Set-Cookie: x=1_?.txt"' in disposition
    assert "filename*=UTF-8''a%22__Set-Cookie%3A%20x%3D1%5C%C3%A9.txt" in disposition
    stored = content_disposition('r"e\\port é.csv')
    assert stored == (
        "attachment; filename=\"r_e_port _.csv\"; filename*=UTF-8''r%22e%5Cport%20%C3%A9.csv"
    )


@pytest.mark.parametrize(
    ("key", "error"),
    [("", BadRequest), ("a\x00b", BadRequest), ("/abs", PathEscape), ("a//b", PathEscape),
     ("../x", PathEscape), ("a/./b", PathEscape), ("a/.tmp/b", PathEscape)],
)  # fmt: skip
def test_an_object_key_that_could_leave_or_hide_in_the_store_is_refused(
    key: str, error: type[Exception]
) -> None:
    with pytest.raises(error):
        check_key(key)


def test_an_object_key_is_its_session_prefix_and_the_name() -> None:
    assert object_key("s1", "a.csv") == "sessions/s1/a.csv"
    assert check_key(object_key("s1", "a.csv")) == ["sessions", "s1", "a.csv"]
