"""Credentials through the code-execution API (the whole app over the fake backend): given at
CreateSession, stored per tenant, listed without values, deleted; malformed ones refused
without echoing a value; nothing stored without the operator's key."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from sandbank.egress.credentials import CredentialSet
from sandbank.interpreter.runs import owner_of
from tests.fakeapp import FakeApp

ALICE, BOB = "alice-tenant-token-1", "bob-tenant-token-2"
SECRET = "sk-live-2b7e151628aed2a6"
KEY = "f0J6Vn2pQ0m1Xr8wYz3k5L7a9c1e3g5i7k9m1o3q5s0="


@pytest.fixture
def app() -> Iterator[tuple[FakeApp, httpx.Client]]:
    fake = FakeApp(exec_tokens=f"{ALICE},{BOB}", credentials_key=KEY)
    with fake.running() as http:
        yield fake, http


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_tenants_stored_credentials_are_sealed_listed_without_values_and_deleted(
    app: tuple[FakeApp, httpx.Client],
) -> None:
    fake, http = app
    body = {"destination": "api.example.com:443", "headers": {"Authorization": f"Bearer {SECRET}"}}
    r = http.post("/credentials", json=body, headers=auth(ALICE))
    assert r.status_code == 201, r.text
    stored = r.json()
    assert stored["destination"] == "api.example.com:443" and stored["headers"] == ["Authorization"]
    assert SECRET not in r.text and stored["scope"] == "tenant"
    on_disk = (fake.dir / "egress" / "credentials.json").read_text()
    assert SECRET not in on_disk and stored["id"] in on_disk

    listed = http.get("/credentials", headers=auth(ALICE)).json()["credentials"]
    assert [c["id"] for c in listed] == [stored["id"]] and SECRET not in json.dumps(listed)
    assert http.get("/credentials", headers=auth(BOB)).json() == {"credentials": []}
    gone = http.delete(f"/credentials/{stored['id']}", headers=auth(BOB))
    assert gone.status_code == 404, gone.text  # another tenant's is not found
    assert http.delete(f"/credentials/{stored['id']}", headers=auth(ALICE)).status_code == 204
    assert http.get("/credentials", headers=auth(ALICE)).json() == {"credentials": []}
    assert stored["id"] not in (fake.dir / "egress" / "credentials.json").read_text()


def test_a_sessions_own_credentials_are_listed_in_its_handle_and_deleted(
    app: tuple[FakeApp, httpx.Client],
) -> None:
    fake, http = app
    credentials = [
        {"id": "pypi", "destination": "*.pkg.example:443",
         "basic": {"username": "me", "password": SECRET}},
        {"destination": "maps.example:443", "query": {"name": "key", "value": SECRET}},
    ]  # fmt: skip
    r = http.post("/sessions", json={"credentials": credentials}, headers=auth(ALICE))
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    handle = http.get(f"/sessions/{sid}", headers=auth(ALICE))
    assert SECRET not in handle.text
    shown = handle.json()["credentials"]
    assert (shown[0]["id"], shown[0]["kind"]) == ("pypi", "basic")
    assert shown[1]["query"] == "key" and shown[1]["id"].startswith("cred_")
    assert http.get(f"/sessions/{sid}/credentials", headers=auth(BOB)).status_code == 404

    assert http.delete(f"/sessions/{sid}/credentials/pypi", headers=auth(ALICE)).status_code == 204
    r = http.delete(f"/sessions/{sid}/credentials/pypi", headers=auth(ALICE))
    assert r.status_code == 404
    session = fake.sandboxes.session(sid, fake.sandboxes.sessions()[0].tenant)
    assert session.credentials.find("a.pkg.example", 443) is None
    assert session.credentials.find("maps.example", 443) is not None

    r = http.put(f"/sessions/{sid}/credentials", json={"credentials": []}, headers=auth(ALICE))
    assert r.json() == {"credentials": []} and len(session.credentials) == 0


@pytest.mark.parametrize(
    ("credential", "said"),
    [
        ({"destination": "10.0.0.1:443", "headers": {"X-Key": SECRET}}, "never to addresses"),
        ({"destination": "a.example:443", "headers": {"Host": SECRET}}, "not settable"),
        ({"destination": "a.example:443", "headers": {"X": SECRET + "\n"}}, "printable ASCII"),
        ({"destination": "a.example", "query": {"name": "k", "value": SECRET}}, "NAME:PORT"),
        ({"destination": "a.example:443", "secret": SECRET}, "not a field of a credential"),
    ],
)
def test_malformed_credentials_are_refused_naming_the_field_never_the_value(
    app: tuple[FakeApp, httpx.Client], credential: dict[str, object], said: str
) -> None:
    _, http = app
    for r in (
        http.post("/sessions", json={"credentials": [credential]}, headers=auth(ALICE)),
        http.post("/credentials", json=credential, headers=auth(ALICE)),
    ):
        assert r.status_code == 422, r.text
        assert said in r.json()["detail"] and SECRET not in r.text, r.text


def test_without_the_operators_key_nothing_is_stored_but_sessions_still_take_theirs() -> None:
    fake = FakeApp()
    with fake.running() as http:
        body = {"destination": "api.example.com:443", "headers": {"X-Key": SECRET}}
        r = http.post("/credentials", json=body)
        assert r.status_code == 409 and "SANDBANK_CREDENTIALS_KEY" in r.text, r.text
        assert SECRET not in r.text
        r = http.post("/sessions", json={"credentials": [body]})
        assert r.status_code == 201 and len(r.json()["credentials"]) == 1


def test_a_user_of_the_interpreter_api_stores_credentials_their_sandboxes_get(
    app: tuple[FakeApp, httpx.Client],
) -> None:
    fake, _ = app
    name, key = fake.new_user()
    other_name, other_key = fake.new_user()
    body = {"destination": "api.example.com:443", "headers": {"X-Key": SECRET}}
    with fake.client(headers={"Authorization": f"Bearer {key}"}) as user:
        r = user.post("/api/credentials", json=body)
        assert r.status_code == 200 and SECRET not in r.text, r.text
        stored = r.json()
        assert stored["headers"] == ["X-Key"] and stored["scope"] == "user"
        assert user.get("/api/credentials").json()["credentials"][0]["id"] == stored["id"]
        bad = user.post("/api/credentials", json={**body, "destination": "1.2.3.4:443"})
        assert bad.status_code == 400 and SECRET not in bad.text, bad.text
        found = [fake.call(fake.store.accounts.get_user, n) for n in (name, other_name)]
        user_id, other_id = (u.id for u in found if u is not None)
        # The sandboxes the interpreter leases for this user (owner_of) get it; another's not.
        book = fake.sandboxes.credentials
        assert book.chain(owner_of(user_id), CredentialSet()).find("api.example.com", 443)
        assert book.chain(owner_of(other_id), CredentialSet()).find("api.example.com", 443) is None
        with fake.client(headers={"Authorization": f"Bearer {other_key}"}) as other:
            assert other.get("/api/credentials").json() == {"credentials": []}
            assert other.delete(f"/api/credentials/{stored['id']}").status_code == 404
        assert user.delete(f"/api/credentials/{stored['id']}").status_code == 200
        assert book.chain(owner_of(user_id), CredentialSet()).find("api.example.com", 443) is None
