"""The operator's endpoints over fakes: `GET /admin/sessions` behind the admin token, naming no
capability, and off without one; `/metrics` open when the API is. The app runs in-process
(tests/fakeapp.py)."""

from __future__ import annotations

from tests.fakeapp import FakeApp

ADMIN = "admin-token-for-tests"
TOKEN = "tok-alice-0123456789"


def test_the_sessions_are_listed_with_the_admin_token_by_prefix_and_tenant_hash() -> None:
    with FakeApp(admin_token=ADMIN, exec_tokens=TOKEN).running() as c:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        older = c.post("/sessions", json={}, headers=auth).json()["session_id"]
        newer = c.post("/sessions", json={"idle_timeout_seconds": 30}, headers=auth).json()
        for headers in ({}, {"Authorization": "Bearer nope"}, auth):  # an exec token is not it
            r = c.get("/admin/sessions", headers=headers)
            assert r.status_code == 401 and "admin token" in r.json()["detail"]
        r = c.get("/admin/sessions", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200
        listed = r.json()["sessions"]
        assert [s["session"] for s in listed] == [newer["session_id"][:14], older[:14]]
        assert older not in r.text and newer["session_id"] not in r.text  # prefixes only
        assert TOKEN not in r.text and len(listed[0]["tenant"]) == 8
        assert listed[0]["state"] == "idle" and listed[0]["idle_timeout_seconds"] == 30
        assert r.json()["pool_ready"] == 0


def test_without_an_admin_token_the_endpoint_is_off() -> None:
    with FakeApp().running() as c:
        r = c.get("/admin/sessions", headers={"Authorization": "Bearer anything"})
        assert r.status_code == 404 and "SANDBANK_ADMIN_TOKEN" in r.json()["detail"]


def test_without_exec_tokens_the_metrics_are_open_as_the_api_is() -> None:
    with FakeApp().running() as c:
        c.post("/sessions", json={})
        r = c.get("/metrics")
        assert r.status_code == 200 and "sandbank_sessions_created_total 1.0" in r.text
