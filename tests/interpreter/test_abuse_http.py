"""A hostile user of the interpreter API: quotas raced with concurrent requests, event streams
past their caps, and what the agent is told of the network.

The app runs over fakes (tests/fakeapp.py: the fake backend, a scripted model, SQLite and the
local object store in a scratch directory), served on loopback with the listener `sandbank
serve` uses, so that requests really arrive at once and streams stay open. test_abuse.py keeps,
on a real server, the floods whose subject is what its process holds.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandbank.agent.model import SystemMessage
from sandbank.agent.scripted import ScriptedModel
from tests.fakeapp import FakeApp, chat
from tests.interpreter.harness import Client
from tests.support import free_port

QUOTA = 200_000


class Served:
    """The app over fakes served on loopback, as the real-server tests see a server."""

    def __init__(self, fake: FakeApp, url: str) -> None:
        self.fake, self.url = fake, url

    def new_user(self) -> Client:
        name, key = self.fake.new_user()
        return Client(self.url, key, name)


@contextlib.contextmanager
def served(*, model: ScriptedModel | None = None, **settings: Any) -> Iterator[Served]:
    port = free_port()  # signed upload URLs lead back to it
    fake = FakeApp(model=model, public_base_url=f"http://127.0.0.1:{port}", **settings)
    with fake.serving(port) as url:
        yield Served(fake, url)


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    with served(max_stored_bytes_per_user=QUOTA, max_sessions_per_user=3) as started:
        yield started


def _at_once(calls: list[httpx.Request]) -> list[httpx.Response]:
    """Send every request at the same moment, each on a connection of its own."""
    barrier = threading.Barrier(len(calls))
    answers: list[httpx.Response | None] = [None] * len(calls)

    def send(i: int) -> None:
        with httpx.Client(timeout=60) as client:
            barrier.wait()
            answers[i] = client.send(calls[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [a for a in answers if a is not None]


def test_uploads_sent_at_once_never_store_more_than_the_quota(server: Served) -> None:
    with server.new_user() as user:
        sid = user.new_session()
        forms = [
            user.ok("GET", f"/api/sessions/{sid}/files/upload", params={"filename": f"f{i}.csv"})
            for i in range(6)
        ]
        # Each form allows the whole quota (nothing is stored yet): 6 x 100 KB sent at once.
        requests = [
            httpx.Request(
                "POST",
                form["url"],
                data=form["fields"],
                files={"file": (f"f{i}.csv", b"x" * 100_000)},
            )
            for i, form in enumerate(forms)
        ]
        answers = _at_once(requests)
        statuses = sorted(a.status_code for a in answers)
        stored = user.ok("GET", f"/api/sessions/{sid}/files")
        assert sum(f["size"] for f in stored) <= QUOTA
        assert statuses.count(204) == len(stored) >= 1, statuses
        refused = [a for a in answers if a.status_code != 204]
        assert all(a.status_code == 409 for a in refused), [a.text for a in refused]
        assert all(a.json()["error_code"] == 1112 for a in refused)  # quota_exceeded
        # The refused uploads gave their reservations back: once the files go, the whole
        # quota is free again.
        user.ok("DELETE", f"/api/sessions/{sid}")
        fresh = user.new_session()
        assert user.upload(fresh, "all.csv", b"y" * QUOTA).status_code == 204
        full = user.http.get(f"/api/sessions/{fresh}/files/upload", params={"filename": "more.csv"})
        assert full.status_code == 409 and full.json()["error_code"] == 1112


def test_sessions_created_at_once_never_pass_the_users_limit(server: Served) -> None:
    with server.new_user() as user:
        auth = {"Authorization": f"Bearer {user.key}"}
        requests = [
            httpx.Request("POST", f"{server.url}/api/sessions", headers=auth) for _ in range(12)
        ]
        statuses = sorted(a.status_code for a in _at_once(requests))
        assert statuses == [200] * 3 + [409] * 9
        assert len(user.ok("GET", "/api/sessions")) == 3


def test_the_agent_is_told_what_the_sessions_network_policy_allows() -> None:
    model = ScriptedModel(chat)
    allowed = served(model=model, egress_allow="api.example.com:443")
    with allowed as server, server.new_user() as user:
        sid = user.new_session()
        user.ask(sid, "hello")
        assert user.wait(sid)["status"] == "DONE"
    messages, _ = model.calls[-1]
    system = next(m.content for m in messages if isinstance(m, SystemMessage))
    assert "only to api.example.com:443 (HOST:PORT)" in system
    assert "no internet" not in system.lower()


def test_event_streams_are_capped_per_user_and_in_all() -> None:
    caps: dict[str, Any] = {"max_event_streams_per_user": 2, "max_event_streams": 3}
    with served(**caps) as server, server.new_user() as alice, server.new_user() as bob:
        mine, theirs = alice.new_session(), bob.new_session()
        alice.ask(mine, "sleep")  # runs for minutes: its streams stay open
        bob.ask(theirs, "sleep")
        with contextlib.ExitStack() as streams:

            def open_stream(user: Client, sid: str) -> httpx.Response:
                response = streams.enter_context(
                    user.http.stream("GET", f"/api/sessions/{sid}/events", timeout=30)
                )
                if response.status_code != 200:
                    response.read()
                return response

            first = open_stream(alice, mine)
            assert [first.status_code, open_stream(alice, mine).status_code] == [200, 200]
            third = open_stream(alice, mine)
            assert third.status_code == 429 and third.json()["error_code"] == 1052
            assert open_stream(bob, theirs).status_code == 200
            full = open_stream(bob, theirs)  # 3 open on the server
            assert full.status_code == 503 and full.headers["retry-after"] == "5"
            first.close()  # a stream closed by its client gives its slot back
            deadline = time.monotonic() + 10
            while (again := open_stream(bob, theirs)).status_code == 503:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert again.status_code == 200
        alice.ok("POST", f"/api/sessions/{mine}/cancel")
        bob.ok("POST", f"/api/sessions/{theirs}/cancel")
