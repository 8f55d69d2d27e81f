"""Paused sessions on a real server (fork sandboxes): pause and resume over HTTP, what a
snapshot keeps and names as lost, another tenant's paused session, a pause racing a call, a
snapshot changed on disk, a full disk while pausing, SIGTERM and SIGKILL restarts,
hibernation and checkpoints."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Server, data_dir
from tests.tiers import needs

A = {"authorization": "Bearer token-a"}
B = {"authorization": "Bearer token-b"}


@pytest.fixture(scope="module")
@needs("root")
def server() -> Iterator[Server]:
    with data_dir() as d:
        srv = Server(d, exec_tokens="token-a,token-b", pause_on_shutdown=True).start()
        try:
            yield srv
        finally:
            srv.stop()


def _run(c: httpx.Client, sid: str, code: str, tool: str = "code_execution") -> dict[str, Any]:
    key = "code" if tool == "code_execution" else "command"
    r = c.post(f"/sessions/{sid}/exec", json={"tool": tool, "input": {key: code}})
    assert r.status_code == 200, r.text
    content: dict[str, Any] = r.json()["result_block"]["content"]
    return content


def _edit(c: httpx.Client, sid: str, **fields: Any) -> dict[str, Any]:
    r = c.post(
        f"/sessions/{sid}/exec",
        json={"tool": "text_editor_code_execution", "input": fields},
    )
    assert r.status_code == 200, r.text
    content: dict[str, Any] = r.json()["result_block"]["content"]
    return content


def _new(c: httpx.Client) -> str:
    r = c.post("/sessions")
    assert r.status_code == 201, r.text
    return str(r.json()["session_id"])


def test_a_paused_session_keeps_its_state_and_names_what_it_lost(server: Server) -> None:
    with server.client(headers=A) as c:
        sid = _new(c)
        _run(
            c, sid,
            "import threading, json as js\n"
            "import pandas as pd\n"
            "df = pd.DataFrame({'a': [1.5, 2.5]})\n"
            "view = df  # shared, not copied\n"
            "square = lambda v: v * v\n"
            "lock = threading.Lock()\n",
        )  # fmt: skip
        _run(
            c, sid,
            "mkdir -p sub && cd sub && export GREETING=hello && hi() { echo \"$GREETING $1\"; }"
            " && shopt -s expand_aliases && alias ll='echo listed'",
            tool="bash_code_execution",
        )  # fmt: skip
        _edit(c, sid, command="create", path="notes.txt", file_text="one\n")
        _edit(c, sid, command="str_replace", path="notes.txt", old_str="one", new_str="two")

        r = c.post(f"/sessions/{sid}/pause")
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "paused"
        assert c.get(f"/sessions/{sid}").json()["state"] == "paused"
        # Nothing of it runs: its uid's processes are gone, its snapshot is on disk.
        snapshot = server.data / "paused" / sid
        assert {p.name for p in snapshot.iterdir()} >= {"disk.img", "state", "manifest.json"}
        assert c.get(f"/sessions/{sid}", headers=B).status_code == 404  # another tenant's
        assert c.post(f"/sessions/{sid}/resume", headers=B).status_code == 404
        assert c.post(f"/sessions/{sid}/pause", headers=B).status_code == 404

        out = _run(c, sid, "print(df.a.sum(), view is df, square(3), js.dumps(1))")
        assert out["stdout"] == "4.0 True 9 1\n"
        assert out["not_restored"] == {
            "lock": "cannot be serialized (TypeError: cannot pickle '_thread.lock' object)"
        }
        assert out["stderr"].startswith("[sandbank] this session was paused and resumed; ")
        assert "lock (cannot be serialized" in out["stderr"]
        assert c.get(f"/sessions/{sid}").json()["state"] == "running"
        again = _run(c, sid, "print(1)")
        assert "not_restored" not in again and again["stderr"] == ""  # told once

        bash = _run(c, sid, "pwd; hi there; ll", tool="bash_code_execution")
        assert bash["stdout"] == "/workspace/sub\nhello there\nlisted\n"
        undo = _edit(c, sid, command="undo_edit", path="notes.txt")
        assert undo["return_code"] == 0, undo
        assert _run(c, sid, "print(open('/workspace/notes.txt').read())")["stdout"] == "one\n\n"
        c.delete(f"/sessions/{sid}")


def test_files_calls_resume_a_paused_session_under_its_id(server: Server) -> None:
    with server.client(headers=A) as c:
        sid = _new(c)
        _run(c, sid, "open('kept.txt', 'w').write('kept'); n = 7")
        assert c.post(f"/sessions/{sid}/pause").json()["state"] == "paused"
        listed = c.get(f"/sessions/{sid}/files/list").json()["files"]
        assert [f["path"] for f in listed] == ["kept.txt"]
        assert c.get(f"/sessions/{sid}").json()["state"] == "running"
        assert c.post(f"/sessions/{sid}/pause").status_code == 200
        assert c.get(f"/sessions/{sid}/files", params={"path": "kept.txt"}).text == "kept"
        assert c.post(f"/sessions/{sid}/pause").status_code == 200
        put = c.post(
            f"/sessions/{sid}/files", files={"file": ("in.txt", b"in")}, data={"path": "in.txt"}
        )
        assert put.status_code == 201, put.text
        assert _run(c, sid, "print(n, open('in.txt').read())")["stdout"] == "7 in\n"
        c.delete(f"/sessions/{sid}")
        gone = server.data / "paused" / sid
        _wait(lambda: not gone.exists(), 10, "its snapshot to go with it")


def test_pause_and_resume_racing_calls_leave_the_session_whole(server: Server) -> None:
    with server.client(headers=A) as c:
        sid = _new(c)
        _run(c, sid, "total = 0")
        errors: list[str] = []

        def calls() -> None:
            with server.client(headers=A) as mine:
                for _ in range(6):
                    out = _run(mine, sid, "total += 1")
                    if out["return_code"] != 0:
                        errors.append(out["stderr"])

        def pauses() -> None:
            with server.client(headers=A) as mine:
                for _ in range(4):
                    r = mine.post(f"/sessions/{sid}/pause")
                    if r.status_code != 200:
                        errors.append(r.text)

        threads = [threading.Thread(target=calls), threading.Thread(target=pauses)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert _run(c, sid, "print(total)")["stdout"] == "6\n"
        c.delete(f"/sessions/{sid}")


def test_a_snapshot_changed_on_disk_is_refused_never_half_restored(server: Server) -> None:
    with server.client(headers=A) as c:
        sid = _new(c)
        _run(c, sid, "secret = 'x' * 1000")
        c.post(f"/sessions/{sid}/pause")
        state = server.data / "paused" / sid / "state"
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
        r = c.post(f"/sessions/{sid}/exec", json={"tool": "code_execution", "input": {"code": "1"}})
        assert r.status_code == 500
        assert r.json()["code"] == "snapshot_damaged"
        assert r.json()["detail"] == (
            f"the snapshot of session {sid!r} is damaged (its state was changed on disk): "
            "it was not restored"
        )
        assert c.get(f"/sessions/{sid}").status_code == 404  # the session is gone, not half-there

        other = _new(c)  # a forged manifest (signed with another key) fails its check too
        c.post(f"/sessions/{other}/pause")
        manifest = server.data / "paused" / other / "manifest.json"
        signed = json.loads(manifest.read_text())
        fields = json.loads(signed["manifest"])
        fields["tenant"] = "someone-else"
        signed["manifest"] = json.dumps(fields)
        manifest.write_text(json.dumps(signed))
        r = c.post(f"/sessions/{other}/resume")
        assert r.status_code == 500 and "fails its integrity check" in r.json()["detail"]


def test_a_full_disk_while_pausing_leaves_the_session_running(server: Server) -> None:
    with server.client(headers=A) as c:
        sid = _new(c)
        _run(c, sid, "blob = bytes(4 << 20); mark = 'still here'")
        target = server.data / "paused" / sid
        target.mkdir(mode=0o700)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tiny", str(target)], check=True)
        try:
            r = c.post(f"/sessions/{sid}/pause")
            assert r.status_code == 507, r.text
            assert "no room" in r.text and "keeps running" in r.text
            assert c.get(f"/sessions/{sid}").json()["state"] == "running"
            assert _run(c, sid, "print(mark, len(blob))")["stdout"] == f"still here {4 << 20}\n"
        finally:
            subprocess.run(["umount", str(target)], check=True)
        assert c.post(f"/sessions/{sid}/pause").status_code == 200  # room again: it pauses
        assert _run(c, sid, "print(mark)")["stdout"] == "still here\n"
        c.delete(f"/sessions/{sid}")


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.usefixtures("machine")
def test_restarts_hibernation_and_checkpoints() -> None:
    """SIGKILL: a checkpointed session resumes from its checkpoint, one never checkpointed
    answers a 404 saying so; idle sessions hibernate; SIGTERM pauses the running ones."""
    with data_dir() as d:
        srv = Server(
            d,
            pause_on_shutdown=True,
            checkpoint_after_idle_seconds=1,
            pause_after_idle_seconds=3,
            reaper_interval_seconds=0.2,
        )
        try:
            srv.start()
            with srv.client() as c:
                kept = _new(c)
                _run(c, kept, "x = 41")
                manifest = d / "paused" / kept / "manifest.json"
                _wait(manifest.exists, 10, "a checkpoint")
                assert _kind(manifest) == "checkpoint"
                lost = _new(c)
                _run(c, lost, "y = 1")
            srv.stop(signal.SIGKILL)

            srv.start()
            with srv.client() as c:
                assert _run(c, kept, "print(x + 1)")["stdout"] == "42\n"
                r = c.get(f"/sessions/{lost}/files/list")
                assert r.status_code == 404
                assert "no snapshot of it was kept" in r.text
                _run(c, kept, "x = 50")
                # (Watched on disk: asking for the handle would count as activity.)
                _wait(lambda: _kind(manifest) == "paused", 15, "hibernation")
                assert _run(c, kept, "print(x)")["stdout"] == "50\n"
            out: dict[str, Any] = {}

            def long_call() -> None:  # running when the server is stopped
                with srv.client() as mine:
                    out.update(_run(mine, kept, "x = 60\nimport time\ntime.sleep(60)"))

            call = threading.Thread(target=long_call)
            call.start()
            time.sleep(1)
            assert srv.stop() in (0, -15)
            call.join(10)
            assert out["return_code"] == 130  # interrupted, its state kept
            assert out["stderr"].endswith(
                "[sandbank] the server is restarting: this call was interrupted, and the session "
                "paused with its state; its next call resumes it\n"
            )

            srv.start()
            with srv.client() as c:
                handle = c.get(f"/sessions/{kept}").json()
                assert handle["state"] == "paused"
                assert _run(c, kept, "print(x)")["stdout"] == "60\n"
        finally:
            srv.stop()


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _kind(manifest: Path) -> str | None:
    try:
        return str(json.loads(json.loads(manifest.read_text())["manifest"])["kind"])
    except (OSError, ValueError):
        return None


@pytest.mark.anyio
@pytest.mark.usefixtures("machine")
async def test_bwrap_sandboxes_pause_and_resume_too() -> None:
    from sandbank.errors import SessionNotFound
    from sandbank.protocol.calls import BashCall, PythonCall
    from sandbank.sandbox.local import LocalSandboxes
    from tests.support import settings

    with data_dir() as d:
        rt = LocalSandboxes(
            settings(d, isolation="bwrap", pause_on_shutdown=True, max_paused_sessions=1)
        )
        await rt.start()
        try:
            sid = (await rt.create("t")).id
            await rt.execute(sid, "t", PythonCall("words = ['kept'] * 3"), 30)
            await rt.execute(sid, "t", BashCall("cd /tmp && export K=v"), 30)
            await rt.write_file(sid, "t", "given.csv", _chunks(b"a,b\n"), read_only=True)
            assert (await rt.pause(sid, "t")).state == "paused"
            assert (await rt.resume(sid, "t")).state == "running"
            out = await rt.execute(sid, "t", PythonCall("print(len(words))"), 30)
            assert (out.stdout, out.not_restored) == ("3\n", {})
            shell = await rt.execute(sid, "t", BashCall("echo $PWD $K; touch /workspace/w"), 30)
            assert (shell.stdout, shell.return_code) == ("/tmp v\n", 0)
            kept = await rt.execute(sid, "t", BashCall("rm -f /workspace/given.csv"), 30)
            assert kept.return_code == 1 and "Operation not permitted" in kept.stderr

            other = (await rt.create("t")).id  # past SANDBANK_MAX_PAUSED_SESSIONS=1
            await rt.pause(sid, "t")
            await rt.pause(other, "t")  # the one paused longest ago ends
            await rt.drain()
            with pytest.raises(SessionNotFound):
                rt.session(sid, "t")
            assert rt.session(other, "t").paused
            assert not (d / "paused" / sid).exists()
        finally:
            await rt.close()
