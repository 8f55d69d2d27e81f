"""Logs and metrics of a real server at debug level: JSON lines with request ids, no secret.
A failing model's log line and count are tested over fakes in test_time_and_files.py.
"""

from __future__ import annotations

import json

import httpx

from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import openai_env, running

EXEC_TOKEN = "canary-exec-token-5f1e"
LLM_KEY = "canary-llm-key-77a0"
SIGNING_KEY = "canary-signing-key-0c3b"
ADMIN_TOKEN = "canary-admin-token-9d2e"


def test_json_logs_carry_request_ids_and_no_secret(llm: FakeLLM, machine: None) -> None:
    env = {
        **openai_env(llm.url),
        "SANDBANK_LLM_API_KEY": LLM_KEY,
        "SANDBANK_EXEC_TOKENS": EXEC_TOKEN,
        "SANDBANK_SIGNING_KEY": SIGNING_KEY,
        "SANDBANK_ADMIN_TOKEN": ADMIN_TOKEN,
        "SANDBANK_LOG_LEVEL": "debug",
        "SANDBANK_LOG_FORMAT": "json",
    }
    with running(env) as server:
        with server.new_user() as user:
            sid = user.new_session()
            assert user.upload(sid, "data.csv", b"name,value\na,1\n").status_code == 204
            user.ask(sid, "Make a report on data.csv")
            assert user.wait(sid)["status"] == "DONE"
            link = user.ok("GET", f"/api/sessions/{sid}/files/download?filename=data.csv")
            assert httpx.get(link["url"]).status_code == 200
            secrets_used = [
                *(user.key, EXEC_TOKEN, LLM_KEY, SIGNING_KEY, ADMIN_TOKEN),
                link["url"].split("=")[-1],  # the download URL's signature
            ]
        auth = {"Authorization": f"Bearer {EXEC_TOKEN}"}
        with httpx.Client(base_url=server.url, headers=auth) as client:
            created = client.post("/sessions", json={}, headers={"X-Request-ID": "trace-me-1"})
            assert created.headers["x-request-id"] == "trace-me-1"
            assert httpx.get(server.url + "/sessions", headers={"Authorization": "Bearer no"})
            metrics = client.get("/metrics").text
            admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            assert client.get("/admin/sessions", headers=admin).status_code == 200
        assert 'sandbank_model_calls_total{outcome="ok"}' in metrics
        assert 'sandbank_agent_runs_total{outcome="done"}' in metrics
        assert "sandbank_agent_steps_count" in metrics
        assert 'sandbank_model_tokens_total{direction="in"}' in metrics
        log = server.log.read_text()

    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert lines and len(lines) == len([x for x in log.splitlines() if x.strip()])
    access = [x for x in lines if x["logger"] == "sandbank.access"]
    assert any(
        x["request_id"] == "trace-me-1" and "POST /sessions 201" in x["message"] for x in access
    )
    assert all(x["request_id"] != "-" for x in access)
    mine = [x for x in access if f"/api/sessions/{sid}" in x["message"]]
    assert mine and all(x.get("session_id") == sid for x in mine)
    assert len({x["request_id"] for x in access}) == len(access)  # one line per request
    assert any(x["message"].startswith("sandbank 0.1.0: single server on http://") for x in lines)
    for secret in secrets_used:
        assert secret not in log, "a secret reached the log"
        assert secret not in metrics, "a secret reached the metrics"
