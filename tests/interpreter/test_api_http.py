"""The interpreter API's HTTP behaviour over fakes: keys, sessions, messages, runs and their
limits, uploads and downloads through signed URLs, CORS, a trusted proxy, the error shape.

The app runs in-process (tests/fakeapp.py): the fake backend, a scripted model, the default
SQLite database and local object store in a scratch directory, the `sandbank` admin commands
in-process on the same data directory. test_life.py keeps, on a real server with a model on
loopback, the whole life of a question that runs real code.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandbank import cli
from sandbank.files.signing import UrlSigner
from tests.fakeapp import BASE_URL, FakeApp
from tests.interpreter.harness import Client, assert_error
from tests.support import free_port


class Server:
    """The fake app as the real-server tests see a server: its URL, data, users, commands."""

    def __init__(self, fake: FakeApp) -> None:
        self.fake = fake
        self.url = BASE_URL
        self.data = fake.dir

    def client(self, **kwargs: Any) -> contextlib.AbstractContextManager[httpx.Client]:
        return self.fake.client(**kwargs)

    def new_user(self) -> User:
        name, key = self.fake.new_user()
        return User(self, key, name)

    def cli(self, *args: str) -> str:
        """`sandbank ARGS --data-dir DATA`, in-process; its output."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main([*args, "--data-dir", str(self.data)]) == 0
        return out.getvalue()


class User(Client):
    """The interpreter API as one user sees it (tests/interpreter/harness.py), over the app."""

    def __init__(self, server: Server, key: str, name: str) -> None:
        self.url, self.key, self.name = server.url, key, name
        self._http = server.client(headers={"Authorization": f"Bearer {key}"})
        self.http = self._http.__enter__()
        self._anonymous = server.client()
        self.anonymous = self._anonymous.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._http.__exit__(None, None, None)
        self._anonymous.__exit__(None, None, None)

    def upload(self, sid: str, filename: str, content: bytes) -> httpx.Response:
        form = self.ok("GET", f"/api/sessions/{sid}/files/upload", params={"filename": filename})
        files = {"file": (filename, content)}
        return self.anonymous.post(form["url"], data=form["fields"], files=files)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    fake = FakeApp(
        max_runs_per_user=1,
        max_runs=2,
        cors_origins="https://app.example",
        trusted_user_header="X-Remote-User",
        trusted_proxies="127.0.0.1/32",
    )
    with fake.running():
        yield Server(fake)


@pytest.fixture(scope="module")
def alice(server: Server) -> Iterator[Client]:
    with server.new_user() as client:
        yield client


@pytest.fixture(scope="module")
def bob(server: Server) -> Iterator[Client]:
    with server.new_user() as client:
        yield client


@pytest.fixture
def anon(server: Server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


SID = "{sid}"
ROUTES = [
    ("POST", "/api/sessions"),
    ("GET", "/api/sessions"),
    ("GET", f"/api/sessions/{SID}"),
    ("DELETE", f"/api/sessions/{SID}"),
    ("POST", f"/api/sessions/{SID}/cancel"),
    ("POST", f"/api/sessions/{SID}/messages"),
    ("GET", f"/api/sessions/{SID}/messages"),
    ("GET", f"/api/sessions/{SID}/events"),
    ("GET", f"/api/sessions/{SID}/files"),
    ("GET", f"/api/sessions/{SID}/files/upload?filename=a.csv"),
    ("GET", f"/api/sessions/{SID}/files/download?filename=a.csv"),
]
SESSION_ROUTES = [r for r in ROUTES if SID in r[1]]


def call(http: httpx.Client, method: str, path: str, sid: str) -> httpx.Response:
    body = {"content": "hi"} if path.endswith("/messages") and method == "POST" else None
    return http.request(method, path.replace(SID, sid), json=body)


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_needs_a_valid_key(server: Server, method: str, path: str) -> None:
    sid = str(uuid.uuid4())
    with server.client() as anonymous:
        assert_error(call(anonymous, method, path, sid), 403, 1011)
        anonymous.headers["Authorization"] = "Bearer sb_not-a-key"
        assert_error(call(anonymous, method, path, sid), 403, 1011)
        anonymous.headers["Authorization"] = "Basic c2I6eA=="
        assert_error(call(anonymous, method, path, sid), 403, 1011)


@pytest.mark.parametrize(("method", "path"), SESSION_ROUTES)
def test_session_routes_refuse_others_unknown_and_malformed_ids(
    alice: Client, bob: Client, method: str, path: str
) -> None:
    sid = alice.new_session()
    assert_error(call(bob.http, method, path, sid), 403, 1011)
    assert_error(call(alice.http, method, path, str(uuid.uuid4())), 404, 1021)
    assert_error(call(alice.http, method, path, "not-a-uuid"), 400, 1001)
    assert alice.ok("GET", f"/api/sessions/{sid}")["status"] == "DONE"  # bob changed nothing
    alice.ok("DELETE", f"/api/sessions/{sid}")


def test_sessions_are_listed_newest_first_with_a_ttl(alice: Client) -> None:
    first, second = alice.new_session(), alice.new_session()
    listed = alice.ok("GET", "/api/sessions")
    ids = [s["session_id"] for s in listed]
    assert ids.index(second) < ids.index(first)
    one = alice.ok("GET", f"/api/sessions/{first}")
    assert one["status"] == "DONE"
    assert abs(one["ttl"] - (time.time() + 7 * 24 * 3600)) < 120
    for sid in (first, second):
        alice.ok("DELETE", f"/api/sessions/{sid}")


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"content": ""}', "application/json"),
        (b'{"content": "   "}', "application/json"),
        (b'{"content": 3}', "application/json"),
        (b'{"role": "user"}', "application/json"),
        (b'{"content": "hi", "role": "assistant"}', "application/json"),
        (b'["content"]', "application/json"),
        (b'{"content": "hi"', "application/json"),
        (b"", "application/json"),
        (b'{"content": "hi"}', "text/plain"),
        (json.dumps({"content": "x" * 20_001}).encode(), "application/json"),
        (b'{"content": "\\ud800"}', "application/json"),
        (b"[" * 50_000 + b"]" * 50_000, "application/json"),
    ],
)
def test_bad_messages_are_400_and_store_nothing(
    alice: Client, body: bytes, content_type: str
) -> None:
    sid = alice.new_session()
    response = alice.http.post(
        f"/api/sessions/{sid}/messages", content=body, headers={"Content-Type": content_type}
    )
    assert_error(response, 400, 1001)
    assert alice.ok("GET", f"/api/sessions/{sid}/messages") == []
    alice.ok("DELETE", f"/api/sessions/{sid}")


def test_a_bad_from_is_400(alice: Client) -> None:
    sid = alice.new_session()
    for bad in ("yesterday", "nan", "inf"):
        for route in ("messages", "events"):
            response = alice.http.get(f"/api/sessions/{sid}/{route}", params={"from": bad})
            assert_error(response, 400, 1001)
    alice.ok("DELETE", f"/api/sessions/{sid}")


def test_unknown_routes_and_methods_keep_the_error_shape(alice: Client) -> None:
    assert_error(alice.http.get("/api/nothing-here"), 404)
    assert_error(alice.http.put("/api/sessions"), 405)


def test_a_second_question_while_running_is_409_and_cancel_ends_the_run(alice: Client) -> None:
    sid = alice.new_session()
    alice.ask(sid, "Please sleep")
    pending = alice.ok("GET", f"/api/sessions/{sid}")
    assert pending["status"] == "PENDING"
    message = assert_error(
        alice.http.post(f"/api/sessions/{sid}/messages", json={"content": "and now?"}), 409, 1110
    )
    assert "already in progress" in message
    alice.wait_for_status(sid, "running code")
    cancelled = alice.ok("POST", f"/api/sessions/{sid}/cancel")
    assert cancelled["status"] == "ERROR"
    assert cancelled["status_message"] == "cancelled"
    history = alice.ok("GET", f"/api/sessions/{sid}/messages")
    assert [m["content"] for m in history if m["role"] == "user"] == ["Please sleep"]
    assert_error(alice.http.post(f"/api/sessions/{sid}/cancel"), 409, 1030)
    # The session takes questions again; its sandbox was replaced and the agent is told.
    alice.ask(sid, "Hello again")
    assert alice.wait(sid)["status"] == "DONE"
    alice.ok("DELETE", f"/api/sessions/{sid}")


def test_a_session_shows_whether_it_has_a_sandbox(alice: Client) -> None:
    """`sandbox` (an addition): none before the first question and once a cancel ended it,
    running after an answer (tests/interpreter/test_paused_chat.py shows it paused)."""
    created = alice.ok("POST", "/api/sessions")
    sid = created["session_id"]
    assert created["sandbox"] == "none"
    assert alice.ok("GET", f"/api/sessions/{sid}")["sandbox"] == "none"
    alice.ask(sid, "Hello")
    assert alice.wait(sid)["status"] == "DONE"
    assert alice.ok("GET", f"/api/sessions/{sid}")["sandbox"] == "running"
    listed = {s["session_id"]: s for s in alice.ok("GET", "/api/sessions")}
    assert listed[sid]["sandbox"] == "running"
    with_messages = alice.ok("GET", f"/api/sessions/{sid}", params={"include_messages_from": 0})
    assert with_messages["sandbox"] == "running"
    renamed = alice.ok("PATCH", f"/api/sessions/{sid}", json={"title": "named"})
    assert renamed["sandbox"] == "running"
    alice.ask(sid, "Please sleep")
    alice.wait_for_status(sid, "running code")
    assert alice.ok("POST", f"/api/sessions/{sid}/cancel")["sandbox"] == "none"
    alice.ok("DELETE", f"/api/sessions/{sid}")


def test_run_limits_per_user_and_in_total(server: Server, alice: Client, bob: Client) -> None:
    mine, mine_too, bobs = alice.new_session(), alice.new_session(), bob.new_session()
    alice.ask(mine, "sleep")
    message = assert_error(
        alice.http.post(f"/api/sessions/{mine_too}/messages", json={"content": "x"}), 409, 1111
    )
    assert "runs in progress" in message
    bob.ask(bobs, "sleep")
    with server.new_user() as carol:
        hers = carol.new_session()
        response = carol.http.post(f"/api/sessions/{hers}/messages", json={"content": "x"})
        assert_error(response, 503, 1050)
        assert response.headers["retry-after"]
        assert carol.ok("GET", f"/api/sessions/{hers}/messages") == []
    alice.ok("DELETE", f"/api/sessions/{mine}")
    bob.ok("POST", f"/api/sessions/{bobs}/cancel")
    bob.ok("DELETE", f"/api/sessions/{bobs}")
    alice.ok("DELETE", f"/api/sessions/{mine_too}")


def test_deleting_a_session_during_a_run_stops_it(alice: Client) -> None:
    sid = alice.new_session()
    alice.ask(sid, "sleep")
    alice.wait_for_status(sid, "running code")
    started = time.monotonic()
    assert alice.ok("DELETE", f"/api/sessions/{sid}") == {}
    assert time.monotonic() - started < 10
    assert_error(alice.http.get(f"/api/sessions/{sid}"), 404)
    # The user's run slot is free again.
    other = alice.new_session()
    alice.ask(other, "Hello")
    assert alice.wait(other)["status"] == "DONE"
    alice.ok("DELETE", f"/api/sessions/{other}")


def signer(server: Server) -> UrlSigner:
    return UrlSigner((server.data / "signing.key").read_text().strip().encode(), server.url)


def test_upload_refusals_store_nothing(server: Server, alice: Client, anon: httpx.Client) -> None:
    sid = alice.new_session()
    for bad in ("../x.csv", ".hidden", "a/b.csv", "", "-rf"):
        response = alice.http.get(f"/api/sessions/{sid}/files/upload", params={"filename": bad})
        assert_error(response, 400, 1001)
    assert_error(alice.http.get(f"/api/sessions/{sid}/files/upload"), 400, 1001)
    form = alice.ok("GET", f"/api/sessions/{sid}/files/upload", params={"filename": "a.csv"})
    url, fields = form["url"], form["fields"]
    assert url.startswith(server.url + "/api/uploads?")  # the URL is the credential

    def post(fields: dict[str, str], content: bytes = b"x,y\n", to: str = url) -> httpx.Response:
        return anon.post(to, data=fields, files={"file": ("a.csv", content)})

    other_key = fields["key"].replace("a.csv", "b.csv")
    assert_error(post({**fields, "key": other_key}), 403)
    assert_error(post({**fields, "signature": "0" * 64}), 403)
    assert_error(post({**fields, "policy": fields["policy"][:-4] + "AAAA"}), 403)
    assert_error(post(fields, to=url.replace("signature=", "signature=0")), 403)
    assert_error(post(fields, to=server.url + "/api/uploads"), 403)  # no signed URL
    key = f"sessions/{sid}/a.csv"
    expired = signer(server).upload_form(key, 1000, -10)
    assert "expired" in assert_error(post(expired.fields, to=expired.url), 403)
    small = signer(server).upload_form(key, 10, 60)
    assert_error(post(small.fields, b"0123456789A", to=small.url), 413)
    big_declared = anon.post(
        small.url, data=small.fields, files={"file": ("a.csv", b"0" * 100_000)}
    )
    assert_error(big_declared, 413)
    assert_error(anon.post(url, content=b"x", headers={"Content-Type": "text/plain"}), 400)
    assert alice.ok("GET", f"/api/sessions/{sid}/files") == []
    assert post(small.fields, b"0123456789", to=small.url).status_code == 204  # the cap exactly
    assert alice.ok("GET", f"/api/sessions/{sid}/files")[0]["size"] == 10
    alice.ok("DELETE", f"/api/sessions/{sid}")


def test_download_urls_are_signed(server: Server, alice: Client, anon: httpx.Client) -> None:
    sid = alice.new_session()
    assert alice.upload(sid, "a.csv", b"1,2\n").status_code == 204
    assert alice.upload(sid, "a.csv", b"3,4,5\n").status_code == 204  # replaces
    missing = alice.http.get(f"/api/sessions/{sid}/files/download", params={"filename": "b.csv"})
    assert_error(missing, 404)
    url = alice.ok("GET", f"/api/sessions/{sid}/files/download", params={"filename": "a.csv"})[
        "url"
    ]
    assert anon.get(url).content == b"3,4,5\n"
    assert_error(anon.get(url.replace("signature=", "signature=0")), 403)
    assert_error(anon.get(url.replace("a.csv", "b.csv")), 403)
    assert_error(anon.get(server.url + "/api/downloads"), 400)
    expired = signer(server).download_url(f"sessions/{sid}/a.csv", "a.csv", -10)
    assert_error(anon.get(expired), 403)
    alice.ok("DELETE", f"/api/sessions/{sid}")


def test_cors_allows_only_configured_origins(alice: Client) -> None:
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    allowed = alice.http.options(
        "/api/sessions", headers={"Origin": "https://app.example", **preflight}
    )
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    other = alice.http.options(
        "/api/sessions", headers={"Origin": "https://evil.example", **preflight}
    )
    assert "access-control-allow-origin" not in other.headers
    listed = alice.http.get("/api/sessions", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in listed.headers


def test_a_trusted_proxy_may_name_the_user(server: Server, alice: Client) -> None:
    with server.client() as proxy:
        mine = proxy.get("/api/sessions", headers={"X-Remote-User": alice.name})
        assert mine.status_code == 200
        assert mine.json() == alice.ok("GET", "/api/sessions")
        assert_error(proxy.get("/api/sessions", headers={"X-Remote-User": "nobody-here"}), 403)


def test_keys_can_be_added_listed_and_revoked(server: Server) -> None:
    with server.new_user() as dave:
        second = server.cli("keys", "create", dave.name).strip().splitlines()[-1]
        listing = server.cli("keys", "list", dave.name)
        assert dave.key not in listing and second not in listing
        header, *rows = listing.splitlines()
        assert header.split() == ["KEY_ID", "USER", "CREATED", "LAST_USED", "STATE"]
        ids = [line.split()[0] for line in rows]
        assert len(ids) == 2
        with server.client(headers={"Authorization": f"Bearer {second}"}) as c:
            assert c.get("/api/sessions").status_code == 200
            for key_id in ids:
                server.cli("keys", "revoke", key_id)
            assert_error(c.get("/api/sessions"), 403)
        assert_error(dave.http.get("/api/sessions"), 403)
        assert listing.count("active") == 2
        assert server.cli("keys", "list", dave.name).count("revoked") == 2


def test_deleting_a_user_removes_what_they_own(server: Server) -> None:
    with server.new_user() as erin:
        sid = erin.new_session()
        assert erin.upload(sid, "e.csv", b"1\n").status_code == 204
        objects = list((server.data / "objects").rglob("e.csv"))
        assert objects
        server.cli("users", "delete", erin.name)
        assert_error(erin.http.get("/api/sessions"), 403)
        assert not any(p.exists() for p in objects)


def test_the_served_schema_documents_the_additions(alice: Client) -> None:
    doc = alice.ok("GET", "/api/openapi.json")
    paths = doc["paths"]
    assert "post" in paths["/api/sessions/{session_id}/cancel"]
    events = paths["/api/sessions/{session_id}/events"]["get"]["responses"]
    assert "text/event-stream" in events["200"]["content"] and "404" in events
    assert "/api/uploads" in paths and "/api/downloads" in paths
    assert "409" in paths["/api/sessions/{session_id}/messages"]["post"]["responses"]
    assert "503" in paths["/api/sessions/{session_id}/messages"]["post"]["responses"]
    additions = doc["info"]["x-sandbank-additions"]
    assert "paths./api/uploads" in additions
    assert "paths./api/sessions/{session_id}/events" in additions
    assert "components.schemas.Session.properties.sandbox" in additions
    sandbox = doc["components"]["schemas"]["Session"]["properties"]["sandbox"]
    assert sandbox["enum"] == ["running", "paused", "none"]
    assert doc["info"]["x-sandbank-error-codes"]["run_in_progress"] == 1110
    assert set(doc["components"]["schemas"]) >= {"ToolRecord", "TraceRecord", "ToolOutput"}


def test_renaming_and_asking_again_refuse_what_they_cannot_do(alice: Client) -> None:
    user = alice
    sid = user.new_session()
    r = user.http.post(f"/api/sessions/{sid}/retry")
    assert r.status_code == 400 and "no question to ask again" in r.json()["message"]
    for body in ({"title": 3}, {"name": "x"}, {"title": "x" * 201}):
        assert user.http.patch(f"/api/sessions/{sid}", json=body).status_code == 400
    renamed = user.ok("PATCH", f"/api/sessions/{sid}", json={"title": "  two\nlines\t here "})
    assert renamed["title"] == "two lines here"
    assert "title" not in user.ok("PATCH", f"/api/sessions/{sid}", json={"title": None})
    r = user.http.delete(f"/api/sessions/{sid}/files", params={"filename": "none.csv"})
    assert r.status_code == 404


def test_an_unreachable_model_is_said_at_once_with_what_to_set() -> None:
    """A model endpoint that does not answer (a closed loopback port): a question is refused
    at once, naming the setting (tests/web/test_first_hour.py shows the page saying so)."""
    fake = FakeApp(
        configured_model=True,
        llm_model="openai:gpt-fake",
        llm_base_url=f"http://127.0.0.1:{free_port()}/v1",
        llm_api_key="fake-key",
    )
    with fake.running(), Server(fake).new_user() as user:
        sid = user.new_session()
        started = time.monotonic()
        r = user.http.post(f"/api/sessions/{sid}/messages", json={"content": "hi"})
        assert time.monotonic() - started < 2.5
        message = assert_error(r, 503, 1106)
        assert re.search(r"cannot be reached.*SANDBANK_LLM_BASE_URL", message)
        assert user.ok("GET", f"/api/sessions/{sid}/messages") == []  # nothing stored
